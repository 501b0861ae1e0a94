from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from doctor.probes.gpu import GpuSampler
from doctor.store.samples import read_gpu, read_gpu_info, read_gpu_procs
from tests.fake_nvml import FakeGpu, NVMLError, sample_run
from tests.fake_nvml import FakeNvml as ReplayNvml


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


def test_gpm_metrics_processes_and_what_each_gpu_is(tmp_path: Path) -> None:
    nvml = ReplayNvml([FakeGpu(pids=(4242, 4343), nvlinks=18),
                       FakeGpu(gpm=False, name="NVIDIA A100")])
    sample_run(tmp_path, nvml, seconds=5.0)
    frame = read_gpu(tmp_path)
    first = frame[frame["gpu"] == 0]
    assert first["gpm_sm_active_pct"].isna().iloc[0]  # GPM needs two samples
    assert first["gpm_sm_active_pct"].iloc[1:].eq(90.0).all()
    assert first["gpm_dram_bw_pct"].iloc[1:].eq(30.0).all()
    assert frame.loc[frame["gpu"] == 1, "gpm_sm_active_pct"].isna().all()
    assert nvml.freed == 2  # the GPM samples of GPU 0 are given back
    procs = read_gpu_procs(tmp_path)
    assert set(procs["pid"]) == {4242, 4343} and set(procs["gpu"]) == {0}
    assert 2 <= len(procs) / 2 <= 4  # every 2 s, not at every tick
    info = read_gpu_info(tmp_path)
    assert [g["name"] for g in info] == ["NVIDIA H100 80GB HBM3", "NVIDIA A100"]
    assert info[0]["gpm"] and not info[1]["gpm"] and "no GPM" in info[1]["gpm_reason"]
    assert info[0]["sm_clock_max_mhz"] == 1980 and info[0]["power_limit_w"] == 700
    assert info[0]["pcie_gen_max"] == 5
    assert (info[0]["nvlinks"], info[0]["nvlink_version"]) == (18, 4)
    assert info[1]["nvlinks"] == 0 and info[1]["nvlink_version"] is None  # PCIe only


def test_gpm_that_fails_while_sampling_ends_once_with_its_reason(tmp_path: Path) -> None:
    nvml = ReplayNvml([FakeGpu()])
    calls = [0]

    def failing(request: Any) -> Any:
        calls[0] += 1
        raise NVMLError("Unknown Error")

    nvml.nvmlGpmMetricsGet = failing  # type: ignore[method-assign]
    sample_run(tmp_path, nvml, seconds=3.0)
    assert calls[0] == 1
    assert read_gpu(tmp_path)["util_pct"].notna().all()  # the other counters go on
    assert "failed while sampling" in read_gpu_info(tmp_path)[0]["gpm_reason"]


def test_an_older_run_without_the_new_columns_reads_them_as_nan(tmp_path: Path) -> None:
    old = ("t_s", "gpu", "util_pct", "mem_util_pct", "mem_used_bytes", "mem_total_bytes",
           "pcie_tx_kbps", "pcie_rx_kbps", "sm_clock_mhz", "power_w", "throttle_reasons")
    np.savez_compressed(tmp_path / "gpu.npz", **{c: np.ones(3) for c in old})
    frame = read_gpu(tmp_path)
    assert frame["temp_c"].isna().all() and frame["util_pct"].eq(1).all()
    assert read_gpu_procs(tmp_path).empty and read_gpu_info(tmp_path) == []


def test_a_long_run_keeps_every_gpu_when_it_halves_its_rows(tmp_path: Path,
                                                            monkeypatch: Any) -> None:
    import doctor.probes.gpu as gpu_probe

    monkeypatch.setattr(gpu_probe, "MAX_ROWS", 40)
    nvml = ReplayNvml([FakeGpu(pids=(1,)), FakeGpu(pids=(2,))])
    sample_run(tmp_path, nvml, seconds=30.0)  # 61 ticks of 2 GPUs, halved along the way
    frame = read_gpu(tmp_path)
    assert len(frame) <= 42
    assert frame.groupby("t_s")["gpu"].nunique().eq(2).all()  # each tick whole
    assert set(read_gpu_procs(tmp_path)["pid"]) == {1, 2}
