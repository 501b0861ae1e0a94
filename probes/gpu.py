"""GPU probe: utilisation, memory, PCIe throughput, clocks, power, temperature and throttling
through NVML (``import pynvml``, provided by the maintained ``nvidia-ml-py``), sampled by the
``doctor run`` parent (or doctor.watch's sampler thread) at 1-5 Hz (NVML's counters refresh every
1/6 s to 1 s); the GPM metrics where the GPU has them (doctor.probes.gpm); and, every few
seconds, which processes run on each GPU (to map each rank to its GPU). What each GPU is (name,
uuid, clock and power limits, PCIe link) is read once, into ``gpus.json``. Never spawns
nvidia-smi. Every NVML call goes through one wrapper that degrades to NaN, so one unsupported
counter does not cost the others.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from doctor.probes.gpm import GpmReader
from doctor.probes.tick_tables import TickTable
from doctor.store.samples import GPU_COLUMNS, GPU_PROC_COLUMNS, save_gpu
from doctor.verdict import ProbeStatus

if TYPE_CHECKING:
    from doctor.probes import ParentContext

MAX_ROWS = 200_000
PROCS_EVERY_S = 2.0  # which processes each GPU runs: they change rarely

NO_GPU_HINT = ("GPU metrics need an NVIDIA GPU with its driver; CPU jobs are analysed "
               "without them. In a container, run it with the GPU exposed (--gpus all).")


class GpuSampler:
    name = "gpu"

    def __init__(self, *, clock: Callable[[], float] = time.monotonic,
                 nvml: Any = None, run_dir: Path | None = None, t0: float | None = None) -> None:
        self.clock = clock
        self.run_dir = run_dir
        self.t0 = clock() if t0 is None else t0  # sample times count from the run's start
        self._nvml = nvml
        self._handles: list[Any] = []
        self._status: ProbeStatus | None = None
        self._cols = TickTable(GPU_COLUMNS, MAX_ROWS)  # bounded: doctor.probes.tick_tables
        self._procs = TickTable(GPU_PROC_COLUMNS, MAX_ROWS)
        self._gpm: list[GpmReader] = []
        self._info: list[dict[str, Any]] = []
        self._procs_at = -1e18

    @classmethod
    def for_run(cls, context: ParentContext) -> GpuSampler:
        return cls(clock=context.clock, run_dir=context.run_dir, t0=context.t0)

    def check(self) -> ProbeStatus:
        if self._status is not None:
            return self._status
        try:
            nvml = self._nvml
            if nvml is None:
                import pynvml

                nvml = pynvml
            nvml.nvmlInit()
            count = nvml.nvmlDeviceGetCount()
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self._nvml = nvml
            self._describe()
            self._status = (ProbeStatus(True) if count else
                            ProbeStatus(False, "NVML found no GPU", NO_GPU_HINT))
        except ImportError:
            self._status = ProbeStatus(False, "pynvml is not installed",
                                       "pip install nvidia-ml-py")
        except Exception as err:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            reason = str(err) or type(err).__name__
            if "NVML Shared Library Not Found" in reason or "LibraryNotFound" in type(err).__name__:
                reason = "NVML library not found (no NVIDIA driver on this machine)"
            self._status = ProbeStatus(False, reason, NO_GPU_HINT)
        return self._status

    def _query(self, func: str, *args: Any) -> Any:
        try:
            return getattr(self._nvml, func)(*args)
        except Exception:  # this counter is unsupported here: NaN, the others still count
            return None

    def _first(self, *funcs: str, args: tuple[Any, ...]) -> Any:
        """The first of ``funcs`` that answers (a newer name, then the one older drivers have)."""
        for func in funcs:
            value = self._query(func, *args)
            if value is not None:
                return value
        return None

    def _describe(self) -> None:
        """What each GPU is, once; GPM readers for those that have the metrics."""
        nv = self._nvml
        for i, h in enumerate(self._handles):
            gpm = GpmReader(nv, h)
            self._gpm.append(gpm)
            mem = self._query("nvmlDeviceGetMemoryInfo", h)
            self._info.append({
                "index": i, "name": _text(self._query("nvmlDeviceGetName", h)),
                "uuid": _text(self._query("nvmlDeviceGetUUID", h)),
                "memory_total_bytes": _attr(mem, "total"),
                "sm_clock_max_mhz": _num(self._query(
                    "nvmlDeviceGetMaxClockInfo", h, getattr(nv, "NVML_CLOCK_SM", 1))),
                "power_limit_w": _num(self._query("nvmlDeviceGetEnforcedPowerLimit", h)) / 1000,
                "power_limit_max_w": _max_limit(self._query(
                    "nvmlDeviceGetPowerManagementLimitConstraints", h)),
                "pcie_gen_max": _num(self._query("nvmlDeviceGetMaxPcieLinkGeneration", h)),
                "pcie_width_max": _num(self._query("nvmlDeviceGetMaxPcieLinkWidth", h)),
                **self._nvlinks(h),
                "gpm": gpm.supported, "gpm_reason": gpm.reason,
            })

    def _nvlinks(self, h: Any) -> dict[str, Any]:
        """The GPU's active NVLinks and their version (none on a PCIe-only GPU)."""
        active, version = 0, None
        for link in range(getattr(self._nvml, "NVML_NVLINK_MAX_LINKS", 18)):
            state = self._query("nvmlDeviceGetNvLinkState", h, link)
            if state is None:
                break  # no NVLink here (or no more links)
            if state:
                active += 1
                version = version or self._query("nvmlDeviceGetNvLinkVersion", h, link)
        return {"nvlinks": active, "nvlink_version": _num(version) if version else None}

    def sample(self) -> None:
        if not self.check().ok:
            return
        t = self.clock() - self.t0
        nv = self._nvml
        for i, h in enumerate(self._handles):
            util = self._query("nvmlDeviceGetUtilizationRates", h)
            mem = self._query("nvmlDeviceGetMemoryInfo", h)
            tx = self._query("nvmlDeviceGetPcieThroughput", h,
                             getattr(nv, "NVML_PCIE_UTIL_TX_BYTES", 0))
            rx = self._query("nvmlDeviceGetPcieThroughput", h,
                             getattr(nv, "NVML_PCIE_UTIL_RX_BYTES", 1))
            clock = self._query("nvmlDeviceGetClockInfo", h, getattr(nv, "NVML_CLOCK_SM", 1))
            power = self._query("nvmlDeviceGetPowerUsage", h)
            throttle = self._first("nvmlDeviceGetCurrentClocksEventReasons",
                                   "nvmlDeviceGetCurrentClocksThrottleReasons", args=(h,))
            temp = self._query("nvmlDeviceGetTemperature", h,
                               getattr(nv, "NVML_TEMPERATURE_GPU", 0))
            gpm = self._gpm[i].read()
            row = (t, i, _attr(util, "gpu"), _attr(util, "memory"), _attr(mem, "used"),
                   _attr(mem, "total"), _num(tx), _num(rx), _num(clock),
                   _num(power) / 1000.0, _num(throttle), _num(temp),
                   gpm.get("gpm_sm_active_pct", float("nan")),
                   gpm.get("gpm_tensor_active_pct", float("nan")),
                   gpm.get("gpm_dram_bw_pct", float("nan")))
            self._cols.add(row)
        if t - self._procs_at >= PROCS_EVERY_S:
            self._procs_at = t
            self._sample_processes(t)

    def _sample_processes(self, t: float) -> None:
        for i, h in enumerate(self._handles):
            for proc in self._first("nvmlDeviceGetComputeRunningProcesses",
                                    "nvmlDeviceGetComputeRunningProcesses_v2", args=(h,)) or ():
                pid = getattr(proc, "pid", None)
                if pid is None:
                    continue
                row = (t, i, float(pid), _num(getattr(proc, "usedGpuMemory", None)))
                self._procs.add(row)

    def start(self) -> None:
        pass  # check() opened NVML

    def stop(self) -> None:
        """Hand the samples to the store (``gpu.npz``) and close NVML."""
        for gpm in self._gpm:
            gpm.close()
        for info, gpm in zip(self._info, self._gpm, strict=True):
            info.update(gpm=gpm.supported, gpm_reason=gpm.reason)
        if self.run_dir is not None:
            save_gpu(self.run_dir, self._cols.columns, self._procs.columns, self._info)
        if self._status is not None and self._status.ok:
            self._query("nvmlShutdown")


def _attr(obj: Any, name: str) -> float:
    value = getattr(obj, name, None)
    return float(value) if value is not None else float("nan")


def _num(value: Any) -> float:
    try:
        return float(value) if value is not None else float("nan")
    except (TypeError, ValueError):
        return float("nan")


def _max_limit(constraints: Any) -> float:
    """The board's highest settable power limit, W, from NVML's (min, max) in mW."""
    try:
        return float(constraints[1]) / 1000.0
    except (TypeError, IndexError, ValueError):
        return float("nan")


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value) if value is not None else ""
