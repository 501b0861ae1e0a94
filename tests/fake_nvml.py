"""A fake NVML (the functions of ``pynvml`` that doctor calls) that replays the shapes of real
GPUs: an H100 SXM (80 GB, 1980 MHz, 700 W, PCIe gen5 x16, GPM metrics) by default, an A100
(no GPM) with ``gpm=False``. Each GPU's counters are functions of the sample time, so a test
states the run it wants: a starved GPU, a throttled one, ranks sharing one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from doctor.probes.gpu import GpuSampler
from doctor.store import layout

GIB = 2**30
Series = Callable[[float], float]


def const(value: float) -> Series:
    return lambda _t: value


@dataclass
class FakeGpu:
    util: Series = field(default_factory=lambda: const(95.0))
    mem_used: Series = field(default_factory=lambda: const(30.0 * GIB))
    mem_total: float = 80.0 * GIB
    rx_kbps: Series = field(default_factory=lambda: const(200_000.0))
    tx_kbps: Series = field(default_factory=lambda: const(20_000.0))
    sm_clock: Series = field(default_factory=lambda: const(1980.0))
    power_mw: Series = field(default_factory=lambda: const(550_000.0))
    throttle: Series = field(default_factory=lambda: const(0.0))
    temp_c: Series = field(default_factory=lambda: const(60.0))
    pids: tuple[int, ...] = ()
    pid_memory: Mapping[int, float] = field(default_factory=dict)  # bytes; 4 GiB if not said
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    gpm: bool = True
    gpm_values: Mapping[int, float] = field(
        default_factory=lambda: {2: 90.0, 5: 60.0, 10: 30.0})  # SM, tensor, DRAM bandwidth
    pcie_gen: int = 5
    nvlinks: int = 0  # active NVLinks (0: a PCIe-only GPU, NVLink queries unsupported)
    nvlink_version: int = 4
    power_limit_mw: int = 700_000  # the board's maximum: 700 W


class NVMLError(Exception):
    pass


class FakeNvml:
    """``time`` is read by every counter: tests set it before each sample."""

    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1
    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0
    NVML_GPM_METRICS_GET_VERSION = 1

    def __init__(self, gpus: list[FakeGpu] | None = None, fail_init: Exception | None = None
                 ) -> None:
        self.gpus = gpus if gpus is not None else [FakeGpu()]
        self.fail_init = fail_init
        self.time = 0.0
        self.shut = False
        self.freed = 0

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise self.fail_init

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> str:
        return self.gpus[h].name

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self.gpus[h].uuid

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=self.gpus[h].util(self.time), memory=40)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        g = self.gpus[h]
        return SimpleNamespace(used=g.mem_used(self.time), total=g.mem_total)

    def nvmlDeviceGetPcieThroughput(self, h: int, which: int) -> float:
        g = self.gpus[h]
        return (g.rx_kbps if which == self.NVML_PCIE_UTIL_RX_BYTES else g.tx_kbps)(self.time)

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        if self.gpus[h].nvlinks == 0:
            raise NVMLError("Not Supported")
        return 1 if link < self.gpus[h].nvlinks else 0

    def nvmlDeviceGetNvLinkVersion(self, h: int, link: int) -> int:
        return self.gpus[h].nvlink_version

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return self.gpus[h].pcie_gen

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return 16

    def nvmlDeviceGetClockInfo(self, h: int, which: int) -> float:
        return self.gpus[h].sm_clock(self.time)

    def nvmlDeviceGetMaxClockInfo(self, h: int, which: int) -> int:
        return 1980

    def nvmlDeviceGetPowerUsage(self, h: int) -> float:
        return self.gpus[h].power_mw(self.time)

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return self.gpus[h].power_limit_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, h: int) -> list[int]:
        return [200_000, 700_000]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return int(self.gpus[h].throttle(self.time))

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> float:
        return self.gpus[h].temp_c(self.time)

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        g = self.gpus[h]
        return [SimpleNamespace(pid=p, usedGpuMemory=g.pid_memory.get(p, 4 * GIB))
                for p in g.pids]

    # GPM (Hopper and newer)
    def nvmlGpmQueryDeviceSupport(self, h: int) -> Any:
        return SimpleNamespace(isSupportedDevice=int(self.gpus[h].gpm))

    def nvmlGpmSampleAlloc(self) -> Any:
        return SimpleNamespace(device=None)

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self.freed += 1

    def nvmlGpmSampleGet(self, h: int, sample: Any) -> Any:
        sample.device = h
        return sample

    def c_nvmlGpmMetricsGet_t(self) -> Any:
        return SimpleNamespace(version=0, numMetrics=0, sample1=None, sample2=None,
                               metrics=[SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0)
                                        for _ in range(8)])

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        values = self.gpus[request.sample2.device].gpm_values
        for m in request.metrics[:request.numMetrics]:
            m.value = values.get(m.metricId, 0.0)
        return request


def sample_run(run_dir: Path, nvml: FakeNvml, seconds: float, hz: float = 2.0) -> None:
    """What the doctor run parent's GPU probe writes over ``seconds`` of a run (from its start)."""
    clock = [0.0]
    sampler = GpuSampler(clock=lambda: clock[0], nvml=nvml, run_dir=run_dir, t0=0.0)
    assert sampler.check().ok
    sampler.start()
    n = int(seconds * hz)
    for i in range(n + 1):
        clock[0] = nvml.time = i / hz
        sampler.sample()
    sampler.stop()


def mark_cuda(run_dir: Path, uuids: Mapping[int, str] | None = None) -> None:
    """Say in each training process's meta.json that it computed on a GPU (as a job that
    initialised CUDA says at its exit), on the GPU of ``uuids[rank]`` where given."""
    for proc_dir, rank, role, _pid in layout.process_dirs(run_dir):
        if role.startswith("worker"):
            continue
        meta_path = proc_dir / layout.META
        meta = json.loads(meta_path.read_text())
        meta.update(cuda=True, cuda_initialized=True, cuda_device=0,
                    cuda_uuid=(uuids or {}).get(rank))
        meta_path.write_text(json.dumps(meta))
