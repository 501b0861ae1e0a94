from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from doctor.probes.gpu import GpuSampler
from doctor.store.samples import read_gpu


class FakeNvml:
    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1
    NVML_CLOCK_SM = 1

    def __init__(self, count: int = 2, fail_init: Exception | None = None) -> None:
        self.count = count
        self.fail_init = fail_init
        self.shut = False

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise self.fail_init

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=90 + h, memory=40)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return SimpleNamespace(used=10 * 2**30, total=80 * 2**30)

    def nvmlDeviceGetPcieThroughput(self, h: int, which: int) -> int:
        raise RuntimeError("Not Supported")  # one counter missing must not cost the others

    def nvmlDeviceGetClockInfo(self, h: int, which: int) -> int:
        return 1980

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return 350_000

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return 0

    def nvmlShutdown(self) -> None:
        self.shut = True


def test_samples_every_gpu_and_degrades_one_counter_to_nan(tmp_path: Path) -> None:
    t = [0.0]
    nvml = FakeNvml()
    sampler = GpuSampler(clock=lambda: t[0], nvml=nvml, run_dir=tmp_path)
    assert sampler.check().ok
    sampler.start()
    for _ in range(3):
        t[0] += 0.5
        sampler.sample()
    sampler.stop()
    frame = read_gpu(tmp_path)
    assert len(frame) == 6
    assert sorted(frame["gpu"].unique()) == [0, 1]
    assert frame.loc[frame["gpu"] == 1, "util_pct"].eq(91).all()
    assert frame["pcie_tx_kbps"].isna().all()
    assert frame["power_w"].eq(350.0).all()
    assert nvml.shut


def test_no_driver_is_a_plain_reason_with_a_hint() -> None:
    class NVMLError_LibraryNotFound(Exception):
        pass

    status = GpuSampler(nvml=FakeNvml(fail_init=NVMLError_LibraryNotFound())).check()
    assert not status.ok
    assert status.reason == "NVML library not found (no NVIDIA driver on this machine)"
    assert "CPU jobs are analysed without them" in status.hint


def test_no_gpu_is_said() -> None:
    status = GpuSampler(nvml=FakeNvml(count=0)).check()
    assert not status.ok and status.reason == "NVML found no GPU"


def test_on_this_machine_the_probe_says_why_it_is_off() -> None:
    status = GpuSampler().check()
    assert status.ok or status.reason  # a GPU box samples; anywhere else there is a reason
