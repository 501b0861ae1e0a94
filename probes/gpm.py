"""GPM metrics (Hopper and newer) through NVML: SM activity, Tensor-pipe activity and DRAM
bandwidth utilisation between two samples, which tell compute- from memory-bound without a
profiler. ``nvmlGpmMetricsGet`` takes two samples of the GPU's performance monitors; each tick
takes one and reads the metrics since the previous tick's.

A GPU without GPM (older than Hopper, a driver before R520, a MIG slice without its own
monitors) says so once, in its ``reason``; its columns stay NaN.
"""

from __future__ import annotations

from typing import Any

#: (column, NVML metric constant name, its value in nvml.h): the constants are read from the
#: module where it has them, else these values.
METRICS = (("gpm_sm_active_pct", "NVML_GPM_METRIC_SM_UTIL", 2),
           ("gpm_tensor_active_pct", "NVML_GPM_METRIC_ANY_TENSOR_UTIL", 5),
           ("gpm_dram_bw_pct", "NVML_GPM_METRIC_DRAM_BW_UTIL", 10))
NOT_SUPPORTED = ("this GPU has no GPM metrics (Hopper and newer have them): compute- vs "
                 "memory-bound comes from the profiler window alone")


class GpmReader:
    """The GPM metrics of one GPU, tick to tick; ``reason`` says why there are none."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self.nvml = nvml
        self.handle = handle
        self.reason = ""
        self._samples: list[Any] = []
        self._have_previous = False
        try:
            support = nvml.nvmlGpmQueryDeviceSupport(handle)
            if not getattr(support, "isSupportedDevice", 0):
                self.reason = NOT_SUPPORTED
                return
            self._samples = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
        except Exception as err:  # no such function in an old driver, or not supported
            self.reason = _why(err)

    @property
    def supported(self) -> bool:
        return not self.reason

    def read(self) -> dict[str, float]:
        """The metrics since the previous call (NaN at the first, or when they fail)."""
        out = {column: float("nan") for column, _, _ in METRICS}
        if not self.supported:
            return out
        nvml = self.nvml
        try:
            previous, current = self._samples
            nvml.nvmlGpmSampleGet(self.handle, current)
            if self._have_previous:
                request = nvml.c_nvmlGpmMetricsGet_t()
                request.version = getattr(nvml, "NVML_GPM_METRICS_GET_VERSION", 1)
                request.numMetrics = len(METRICS)
                request.sample1, request.sample2 = previous, current
                for i, (_, name, value) in enumerate(METRICS):
                    request.metrics[i].metricId = getattr(nvml, name, value)
                result = nvml.nvmlGpmMetricsGet(request)
                for i, (column, _, _) in enumerate(METRICS):
                    metric = result.metrics[i]
                    if not getattr(metric, "nvmlReturn", 0):
                        out[column] = float(metric.value)
            self._samples = [current, previous]
            self._have_previous = True
        except Exception as err:  # it worked at the start; a failure now ends it, said once
            self.reason = f"GPM metrics failed while sampling ({_why(err)})"
            self.close()
        return out

    def close(self) -> None:
        for sample in self._samples:
            try:
                self.nvml.nvmlGpmSampleFree(sample)
            except Exception:  # freeing at the end: a failure that ended it is said in reason
                pass
        self._samples = []


def _why(err: Exception) -> str:
    text = str(err) or type(err).__name__
    if "Not Supported" in text or "FunctionNotFound" in type(err).__name__ \
            or "Function Not Found" in text or isinstance(err, AttributeError):
        return NOT_SUPPORTED
    return text
