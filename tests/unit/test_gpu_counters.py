"""NVML's counters over the whole run, into the verdict: recorded loops (fake clock) beside a
fake NVML that replays a GPU's shapes (tests.fake_nvml), analysed as doctor run's would be."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from doctor.analyse.analysis import Analysis
from doctor.analyse.gpu_split import crosscheck_notes
from doctor.analyse.gpus import GpuCounters, GpuSummary
from doctor.pipeline import analyze_run
from doctor.reports.html import render_html
from doctor.reports.json import verdict_data
from doctor.reports.text import render_text
from doctor.verdict import Verdict, check_verdict
from tests.fake_nvml import GIB, FakeGpu, FakeNvml, const, mark_cuda, sample_run
from tests.support import record_loop, write_record

PID = os.getpid()  # the recorded loops' training process
UUIDS = [f"GPU-{i:08d}-0000-0000-0000-000000000000" for i in range(4)]


def gpu_run(tmp_path: Path, gpus: list[FakeGpu], **how: Any) -> Verdict:
    return gpu_analysis(tmp_path, gpus, **how).verdict


def gpu_analysis(tmp_path: Path, gpus: list[FakeGpu], *, steps: int = 60,
                 wait_s: float = 0.001, compute_s: float = 0.05, ranks: int = 1,
                 uuids: dict[int, str] | None = None) -> Analysis:
    for rank in range(ranks):
        record_loop(tmp_path, steps, wait_s=wait_s, compute_s=compute_s, rank=rank)
    mark_cuda(tmp_path, uuids)
    write_record(tmp_path, cores=16)
    sample_run(tmp_path, FakeNvml(gpus), seconds=steps * (wait_s + compute_s), hz=10)
    analysis = analyze_run(tmp_path)
    check_verdict(verdict_data(analysis))
    return analysis


def ids(verdict: Verdict) -> list[str]:
    return [f.id for f in verdict.findings]


def finding(verdict: Verdict, rule_id: str) -> dict:
    return next(f for f in verdict.to_dict()["findings"] if f["id"] == rule_id)


def test_a_gpu_idle_while_the_job_waits_for_input_is_starved(tmp_path: Path) -> None:
    verdict = gpu_run(tmp_path, [FakeGpu(util=const(8.0), pids=(PID,))],
                      wait_s=0.09, compute_s=0.01)
    found = finding(verdict, "gpu.starved")
    assert found["evidence"]["gpu_idle_share"] == pytest.approx(0.92, abs=0.01)
    assert found["evidence"]["input_share"] == pytest.approx(0.9, abs=0.02)
    assert found["category"] == "input"  # no stack samples: the wait is not split
    assert found["severity"] == "critical"
    assert "gpu.host_bound" not in ids(verdict)
    assert verdict.bottleneck == "input"


def test_a_gpu_idle_with_no_input_wait_is_fed_too_slowly_by_its_host(tmp_path: Path) -> None:
    verdict = gpu_run(tmp_path, [FakeGpu(util=const(20.0), pids=(PID,))])
    found = finding(verdict, "gpu.host_bound")
    assert found["category"] == "compute"
    assert found["evidence"]["gpu_idle_share"] == pytest.approx(0.8, abs=0.01)
    assert "gpu.starved" not in ids(verdict)


def test_a_busy_gpu_fires_no_counter_rule(tmp_path: Path) -> None:
    analysis = gpu_analysis(tmp_path, [FakeGpu(util=const(97.0), pids=(PID,))])
    verdict = analysis.verdict
    assert not [i for i in ids(verdict) if i.startswith("gpu.")]
    assert verdict.bottleneck == "compute"
    gpus = verdict_data(analysis)["gpus"]
    assert gpus[0]["util"] == pytest.approx(0.97)
    assert gpus[0]["ranks"] == [0]
    assert gpus[0]["memory_used_max_bytes"] == 30 * GIB
    assert gpus[0]["memory_total_bytes"] == 80 * GIB
    assert gpus[0]["gpm_sm_active"] == pytest.approx(0.9)
    assert gpus[0]["gpm_dram_bw"] == pytest.approx(0.3)


def test_ranks_on_one_gpu_while_the_others_idle(tmp_path: Path) -> None:
    # every rank's process on GPU 0 (the loops share this test's pid), GPUs 1-3 untouched
    gpus = [FakeGpu(util=const(99.0), pids=(PID,)),
            *[FakeGpu(util=const(0.0), uuid=u) for u in UUIDS[1:]]]
    verdict = gpu_run(tmp_path, gpus, ranks=4)
    found = finding(verdict, "gpu.shared")
    assert found["evidence"]["ranks"] == [0, 1, 2, 3]
    assert found["evidence"]["idle_gpus"] == [1, 2, 3]
    assert found["severity"] == "critical"
    assert "set_device(local_rank)" in found["fixes"][0]["code"]
    assert found["estimated_speedup"] == 4.0
    assert "gpu.idle_gpus" not in ids(verdict)


def test_ranks_each_on_its_own_gpu_by_cuda_device_when_nvml_sees_no_job_pid(
        tmp_path: Path) -> None:
    # a container: NVML lists no process of the job; each rank said which GPU it used
    gpus = [FakeGpu(util=const(96.0), uuid=u) for u in UUIDS[:2]]
    analysis = gpu_analysis(tmp_path, gpus, ranks=2, uuids={0: UUIDS[0], 1: UUIDS[1].lower()})
    assert "gpu.shared" not in ids(analysis.verdict)
    assert [g["ranks"] for g in verdict_data(analysis)["gpus"]] == [[0], [1]]


def test_one_rank_on_a_machine_of_four_gpus_says_three_idle(tmp_path: Path) -> None:
    gpus = [FakeGpu(pids=(PID,)), *[FakeGpu(util=const(0.0)) for _ in range(3)]]
    found = finding(gpu_run(tmp_path, gpus), "gpu.idle_gpus")
    assert found["severity"] == "info"
    assert found["evidence"]["idle_gpus"] == [1, 2, 3]
    assert "--nproc-per-node 4" in found["fixes"][0]["code"]


def test_a_gpu_held_under_a_lowered_power_limit(tmp_path: Path) -> None:
    verdict = gpu_run(tmp_path, [FakeGpu(
        pids=(PID,), throttle=lambda t: 0x4 if round(t * 10) % 5 < 3 else 0,  # 3 samples in 5
        sm_clock=const(1400.0), power_mw=const(399_000.0), power_limit_mw=400_000)])
    found = finding(verdict, "gpu.throttled")
    assert found["evidence"]["power_throttled_share"] == pytest.approx(0.6, abs=0.05)
    assert found["evidence"]["thermal_throttled_share"] == 0
    assert found["severity"] == "warning"
    assert "power-throttled" in found["title"] and "71%" in found["title"]
    assert found["fixes"][0]["title"] == "Raise the power limit: 400 W of the board's 700 W"
    assert found["fixes"][0]["code"] == "sudo nvidia-smi -i 0 -pl 700"


def test_a_gpu_at_its_boards_own_power_limit_is_said_with_nothing_to_set(tmp_path: Path
                                                                         ) -> None:
    verdict = gpu_run(tmp_path, [FakeGpu(pids=(PID,), throttle=const(0x4),
                                         sm_clock=const(1700.0), power_mw=const(699_000.0))])
    found = finding(verdict, "gpu.throttled")
    assert found["severity"] == "info" and found["fixes"] == []
    assert "at its power limit (700 W, the board's maximum)" in found["title"]


def test_clocks_below_their_maximum_without_a_limit_point_at_the_clock_settings(
        tmp_path: Path) -> None:
    verdict = gpu_run(tmp_path, [FakeGpu(pids=(PID,), sm_clock=const(1200.0))])
    found = finding(verdict, "gpu.throttled")
    assert found["title"] == ("GPU 0 (NVIDIA H100 80GB HBM3) ran at 61% of its maximum SM clock "
                              "while busy")
    assert found["fixes"][0]["title"] == "Check the clocks set on the GPU"
    assert found["evidence"]["cause"] == "clocks"


def test_a_hot_gpu_is_thermal_throttled(tmp_path: Path) -> None:
    verdict = gpu_run(tmp_path, [FakeGpu(pids=(PID,), throttle=const(0x20 | 0x40),
                                         temp_c=const(91.0))])
    found = finding(verdict, "gpu.throttled")
    assert found["severity"] == "warning"
    assert "Cool" in found["fixes"][0]["title"] and "91 C" in found["fixes"][0]["why"]


def test_a_gpu_without_gpm_says_so_once(tmp_path: Path) -> None:
    analysis = gpu_analysis(tmp_path, [FakeGpu(pids=(PID,), gpm=False,
                                                name="NVIDIA A100-SXM4-40GB")])
    verdict = analysis.verdict
    gpus = verdict_data(analysis)["gpus"]
    assert "gpm_sm_active" not in gpus[0]
    assert "no GPM metrics" in gpus[0]["gpm_reason"]
    assert sum("GPM metrics" in n for n in verdict.notes) == 1


def test_without_the_window_the_counters_split_transfer_from_compute(tmp_path: Path) -> None:
    # the GPU computes 40 % of the time and the link is busy 50 %: the copies the kernels did
    # not hide are at most the 60 % idle, so transfer 50 %, compute the rest
    link_kbps = 3.938e9 * 16 / 1024  # PCIe gen5 x16 per direction, KB/s
    verdict = gpu_run(tmp_path, [FakeGpu(pids=(PID,), util=const(40.0),
                                         rx_kbps=const(0.5 * link_kbps), tx_kbps=const(0.0))])
    assert verdict.bottleneck == "transfer"
    assert verdict.shares["transfer"] == pytest.approx(0.5, abs=0.03)
    assert verdict.shares["compute"] == pytest.approx(0.48, abs=0.03)
    assert any("split into transfer and compute by NVML" in n for n in verdict.notes)
    assert not any("No torch.profiler window" in n for n in verdict.notes)


def test_a_cpu_job_on_a_gpu_machine_gets_no_counter_rules_only_the_unused_gpu(
        tmp_path: Path) -> None:
    record_loop(tmp_path, 40, wait_s=0.001, compute_s=0.05)  # torch imported, CUDA unused
    write_record(tmp_path)
    sample_run(tmp_path, FakeNvml([FakeGpu(util=const(0.0))]), seconds=2.0)
    verdict = analyze_run(tmp_path).verdict
    assert verdict.job["device"] == "cpu"
    assert [i for i in ids(verdict) if i.startswith("gpu.")] == ["gpu.unused"]
    assert "gpu.starved" in verdict.rules_skipped


def test_a_cpu_run_without_gpu_samples_skips_every_counter_rule(tmp_path: Path) -> None:
    record_loop(tmp_path, 40, wait_s=0.09, compute_s=0.01)
    write_record(tmp_path)
    analysis = analyze_run(tmp_path)
    skipped = analysis.verdict.rules_skipped
    for rule_id in ("gpu.starved", "gpu.host_bound", "gpu.shared", "gpu.throttled"):
        assert "gpus" in skipped[rule_id]
    assert "gpus" not in verdict_data(analysis)


def test_the_report_shows_each_gpu_and_the_run_in_tenths(tmp_path: Path) -> None:
    gpu_run(tmp_path, [FakeGpu(pids=(PID,), mem_used=lambda t: (10 + 5 * t) * GIB)])
    analysis = analyze_run(tmp_path)
    over = analysis.tables.gpu_over_run
    assert over is not None
    assert len(over) == 10
    assert over["memory_used_bytes"].is_monotonic_increasing  # memory grows over the run
    first, last = over["steps"].iloc[0]  # numbers: the report words them (reports.tables)
    assert f"{first}-{last}".startswith(("1-", "2-", "3-", "4-", "5-", "6-"))
    page = render_html(analysis)
    assert f"{first}-{last}" in page
    assert "Per GPU: NVML over the analysed steps" in page
    assert "NVIDIA H100 80GB HBM3" in page


def test_the_terminal_says_each_gpu_in_a_line(tmp_path: Path) -> None:
    gpu_run(tmp_path, [FakeGpu(pids=(PID,), sm_clock=const(1500.0))])
    text = render_text(analyze_run(tmp_path))
    assert ("GPU 0 (NVIDIA H100 80GB HBM3), rank 0: busy 95%, memory 30.0 GiB of 80.0 GiB at "
            "peak, SM clock 76% of max") in text


def test_the_window_and_nvml_disagreeing_is_said() -> None:
    nan = float("nan")
    gpu = GpuSummary(node=0, index=0, name="", uuid="", samples=20, util=0.3,
                     mem_used_mean_bytes=nan, mem_used_max_bytes=nan, mem_total_bytes=nan,
                     pcie_rx_bytes_s=nan, pcie_tx_bytes_s=nan, pcie_link_bytes_s=nan,
                     sm_clock_mhz=nan, sm_clock_max_mhz=nan, power_w=nan, power_limit_w=nan,
                     power_limit_max_w=nan, temp_max_c=nan, power_throttled=nan,
                     thermal_throttled=nan, hw_slowdown=nan, ranks=(0,))
    counters = GpuCounters(gpus=(gpu,), rank_gpu={0: (0, 0)}, mapped_by="nvml processes",
                           samples=pd.DataFrame())
    window = pd.DataFrame({"rank": [0, 0], "device": ["cuda", "cuda"], "dur_s": [0.1, 0.1],
                           "gpu_busy_s": [0.09, 0.09], "analyzed": [True, True]})
    [note] = crosscheck_notes(counters, window)
    assert "kernels ran 90%" in note and "busy 30%" in note
    assert crosscheck_notes(counters, window.assign(gpu_busy_s=0.04)) == []  # 40 % vs 30 %
    # copies alone are no kernel time for NVML (the H200's pageable_copy: 72 % busy, 4 % kernels)
    copying = window.assign(transfer_exposed_s=[0.06, 0.06])
    assert crosscheck_notes(counters, copying) == []


def test_every_rank_starved_is_one_finding_for_the_job(tmp_path: Path) -> None:
    gpus = [FakeGpu(util=const(10.0 + i), uuid=u) for i, u in enumerate(UUIDS)]
    verdict = gpu_run(tmp_path, gpus, ranks=4, wait_s=0.09, compute_s=0.01,
                      uuids=dict(enumerate(UUIDS)))
    [found] = [f for f in verdict.to_dict()["findings"] if f["id"] == "gpu.starved"]
    assert found["evidence"]["ranks"] == [0, 1, 2, 3]
    assert found["evidence"]["gpu_idle_share_max"] == pytest.approx(0.9)
    assert found["title"].startswith("The GPUs of 4 ranks idle 88% of the run")


def test_several_throttled_gpus_are_one_finding_naming_them(tmp_path: Path) -> None:
    gpus = [FakeGpu(uuid=u, throttle=const(0x4 if i else 0x20)) for i, u in enumerate(UUIDS)]
    verdict = gpu_run(tmp_path, gpus, ranks=4, uuids=dict(enumerate(UUIDS)))
    [found] = [f for f in verdict.to_dict()["findings"] if f["id"] == "gpu.throttled"]
    assert found["evidence"]["throttled_gpus"] == [0, 1, 2, 3]
    assert found["title"].startswith("4 GPUs held down; the worst: GPU ")


def test_gpus_the_job_was_not_let_see_are_not_idle_gpus(tmp_path: Path) -> None:
    gpus = [FakeGpu(pids=(PID,), uuid=UUIDS[0]),
            *[FakeGpu(util=const(0.0), uuid=u) for u in UUIDS[1:]]]
    record_loop(tmp_path, 60, wait_s=0.001, compute_s=0.05)
    mark_cuda(tmp_path)
    visible = f"{UUIDS[0][:12]},{UUIDS[3]},2"  # an index: CUDA's order, maybe not NVML's
    write_record(tmp_path, cores=16, env={"CUDA_VISIBLE_DEVICES": visible})
    sample_run(tmp_path, FakeNvml(gpus), seconds=3.0, hz=10)
    found = finding(analyze_run(tmp_path).verdict, "gpu.idle_gpus")
    assert found["evidence"]["idle_gpus"] == [3]  # 1 was hidden from the job, 2 may have been


def test_a_stray_context_on_gpu_0_does_not_move_a_rank_there(tmp_path: Path) -> None:
    # the rank's own GPU is 2; a few hundred MB on GPU 0 (torch.load without map_location)
    gpus = [FakeGpu(util=const(3.0), pids=(PID,), pid_memory={PID: 0.5 * GIB}),
            FakeGpu(util=const(0.0)),
            FakeGpu(util=const(97.0), pids=(PID,), pid_memory={PID: 60 * GIB})]
    analysis = gpu_analysis(tmp_path, gpus)
    verdict = analysis.verdict
    assert [g["ranks"] for g in verdict_data(analysis)["gpus"]] == [[], [], [0]]
    assert "gpu.host_bound" not in ids(verdict)
    assert finding(verdict, "gpu.idle_gpus")["evidence"]["idle_gpus"] == [1]  # 0: a context
