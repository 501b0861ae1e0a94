"""doctor's analysis of run directories recorded on a real GPU (an NVIDIA H200 and an H100, torch
2.11.0+cu130; tests/data/gpu_runs/README.md): each sample job's verdict is the one its docstring
calls for, and the GPU's own figures (NVML, GPM, CUDA memory) reach the verdict. These need no
GPU: they read the recordings, so CI on CPUs keeps checking the GPU side of the analysis.

Behaviour, not the digits: the bottleneck, which findings are there, estimates within what the
job's ``--fixed`` variant measured in the same session, figures within their bounds."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from doctor.pipeline import analyze_run
from doctor.reports.json import verdict_data
from doctor.verdict import check_verdict
from tests.support import ROOT

GPU_RUNS = ROOT / "tests" / "data" / "gpu_runs"
RUNS = ("pageable_copy", "conv_layout", "launch_bound", "launch_bound-nowindow",
        "launch_bound-fixed", "memory-memory_creep", "amp-grad", "amp-output")
H200, H100 = "NVIDIA H200", "NVIDIA H100 80GB HBM3"
#: The GPU each run was recorded on (the rest on the H200), and each GPU's memory in GiB: NVML's
#: total, and what torch's allocator may take.
RECORDED_ON = {"amp-grad": H100, "amp-output": H100}
GIB = {H200: (140.4, 139.8), H100: (79.65, 79.18)}
#: What amp_skips.py --device cuda printed: its skipped iterations' share of its loop and its
#: losses that were not finite (300 iterations, every third skipped).
AMP_JOB = {"amp-grad": (0.26948, 0), "amp-output": (0.28204, 100)}

#: The jobs' own median step in seconds, as recorded and with ``--fixed``, that they printed in
#: the same session (README.md there): no estimate of the fix should promise more than it gave.
MEASURED = {
    "pageable_copy": (0.016136, 0.002180),
    "conv_layout": (0.009143, 0.007681),
    "launch_bound": (0.015426, 0.002105),
}
#: What memory_creep.py printed it keeps alive every step (``kept_per_step_bytes``).
CREEP_EXPECTED_BYTES = 3420160
#: One pageable batch of gpu_pageable_copy.py: 128 x 3 x 224 x 224 float32 images, 128 int64
#: labels, in MiB (the finding's ``htod_mb_per_step``).
PAGEABLE_MIB = (128 * 3 * 224 * 224 * 4 + 128 * 8) / 2**20
GPM_KEYS = ("gpm_sm_active", "gpm_tensor_active", "gpm_dram_bw")

Verdict = dict[str, Any]


@pytest.fixture(scope="module")
def verdict_of(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Verdict]:
    """The verdict.json dict of a recorded run, analysed once per module on a copy (the analysis
    may write beside the run): ``Verdict.to_dict()`` with the sections (gpus, memory, ops, gc)."""
    done: dict[str, Verdict] = {}

    def of(name: str) -> Verdict:
        if name not in done:
            run = tmp_path_factory.mktemp("gpu_runs") / name
            shutil.copytree(GPU_RUNS / name, run)
            analysis = analyze_run(Path(run))
            own = analysis.verdict.to_dict()
            data = verdict_data(analysis)
            assert {k: data[k] for k in own if k != "job"} == {
                k: v for k, v in own.items() if k != "job"}
            done[name] = data
        return done[name]

    return of


def findings(verdict: Verdict, rule: str) -> list[dict[str, Any]]:
    return [f for f in verdict["findings"] if f["id"] == rule]


def finding(verdict: Verdict, rule: str) -> dict[str, Any]:
    found = findings(verdict, rule)
    assert len(found) == 1, (rule, [f["id"] for f in verdict["findings"]])
    return found[0]


def ids(verdict: Verdict) -> set[str]:
    return {f["id"] for f in verdict["findings"]}


def measured_speedup(job: str) -> float:
    plain, fixed = MEASURED[job]
    return plain / fixed


def test_the_recordings_are_complete() -> None:
    """What the README lists is what is here, without what doctor writes again."""
    assert sorted(p.name for p in GPU_RUNS.iterdir() if p.is_dir()) == sorted(RUNS)
    for name in RUNS:
        run = GPU_RUNS / name
        assert (run / "run.json").is_file() and (run / "gpu.npz").is_file(), name
        assert (run / "gpus.json").is_file() and (run / "host.npz").is_file(), name
        assert not any((run / f).exists() for f in ("verdict.json", "report.html",
                                                   "timeline.json.gz")), name
        traces = list(run.glob("rank-0/main-*/trace.json.gz"))
        assert len(traces) == (0 if name.endswith("-nowindow") else 1), name


@pytest.mark.parametrize("name", RUNS)
def test_every_run_is_a_gpu_job_on_its_gpu(verdict_of: Callable[[str], Verdict],
                                           name: str) -> None:
    verdict = verdict_of(name)
    gpu_name = RECORDED_ON.get(name, H200)
    nvml_gib, torch_gib = GIB[gpu_name]
    check_verdict(verdict)
    assert verdict["job"]["device"] == "cuda"
    assert verdict["job"]["torch_version"] == "2.11.0+cu130"
    assert verdict["job"]["exit_code"] == 0 and not verdict["partial"]
    assert all(0.0 <= s <= 1.0 for s in verdict["shares"].values()), verdict["shares"]
    assert sum(verdict["shares"].values()) == pytest.approx(1.0, abs=1e-3)
    assert verdict["probes"]["gpu"]["ok"]
    # a GPU job is not said to leave its GPU idle, nor to have computed on the CPU
    assert not ids(verdict) & {"gpu.unused", "trace.cpu_only", "steps.none"}
    # no fix is offered that doctor estimates would slow the job
    assert all(f["estimated_speedup"] is None or f["estimated_speedup"] >= 1.0
               for f in verdict["findings"]), verdict["findings"]

    # NVML's figures over the run, GPU 0 for rank 0
    [gpu] = verdict["gpus"]
    assert gpu["name"] == gpu_name and gpu["index"] == 0 and gpu["ranks"] == [0]
    assert gpu["samples"] >= 1
    assert 0.0 < gpu["util"] <= 1.0
    for key in GPM_KEYS:
        assert key in gpu and 0.0 <= gpu[key] <= 1.0, (key, gpu.get(key))
    assert gpu["memory_total_bytes"] == pytest.approx(nvml_gib * 2**30, rel=0.01)
    assert 0 < gpu["memory_used_max_bytes"] < gpu["memory_total_bytes"]
    assert gpu["other_processes"] == 0

    # the memory section: rank 0's CUDA memory against the GPU's
    [rank] = verdict["memory"]["ranks"]
    assert rank["rank"] == 0 and rank["device"] == "cuda"
    assert 0 < rank["peak_bytes"] <= rank["capacity_bytes"]
    assert rank["capacity_bytes"] == pytest.approx(torch_gib * 2**30, rel=0.01)
    assert rank["allocator"]["allocated_peak_bytes"] > 0
    assert rank["allocator"]["num_ooms"] == 0


def test_pageable_copy_is_transfer_bound(verdict_of: Callable[[str], Verdict]) -> None:
    """gpu_pageable_copy.py: ~77 MB batches copied from pageable memory, blocking, every step."""
    verdict = verdict_of("pageable_copy")
    assert verdict["bottleneck"] == "transfer"
    shares = verdict["shares"]
    assert shares["transfer"] > 0.5 and shares["transfer"] == max(shares.values()), shares

    copy = verdict["findings"][0]  # the top finding
    assert copy["id"] == "gpu.pageable_copy" and copy["severity"] == "critical"
    assert 1.5 < copy["estimated_speedup"] <= measured_speedup("pageable_copy")
    ev = copy["evidence"]
    assert ev["htod_pageable_per_step"] >= 1 and ev["htod_pinned_per_step"] == 0
    assert ev["htod_mb_per_step"] == pytest.approx(PAGEABLE_MIB, rel=0.02)
    assert any(fix.get("apply") == {"dataloader": {"pin_memory": True}}
               for fix in copy["fixes"]), copy["fixes"]

    # the blocking copy's own sync is no separate bottleneck
    assert all(f["estimated_speedup"] < 1.1 for f in findings(verdict, "gpu.host_sync"))
    # NVML: the GPU's kernels mostly wait for the copies, which cross PCIe at GB/s
    [gpu] = verdict["gpus"]
    assert gpu["util"] < 0.5
    assert gpu["pcie_rx_bytes_per_s"] > 1e9


def test_conv_layout_is_compute_with_channels_last(verdict_of: Callable[[str], Verdict]) -> None:
    """gpu_conv_layout.py: a CNN under autocast on NCHW tensors; ``--fixed`` is channels_last."""
    verdict = verdict_of("conv_layout")
    assert verdict["bottleneck"] == "compute"
    assert verdict["shares"]["transfer"] < 0.05

    layout = finding(verdict, "ops.channels_last")
    assert 1.0 < layout["estimated_speedup"] <= measured_speedup("conv_layout")
    assert layout["evidence"]["nchw_calls"] > 0 and layout["evidence"]["nhwc_calls"] == 0
    assert any("channels_last" in fix["title"] for fix in layout["fixes"])

    # one .item() a step: no critical host sync (the profiler's own closing sync is not the job's)
    assert all(f["estimated_speedup"] <= 1.1 for f in findings(verdict, "gpu.host_sync"))
    assert not ids(verdict) & {"gpu.pageable_copy", "gpu.transfer_exposed"}
    # the GPU is busy, and in 16 bits
    [gpu] = verdict["gpus"]
    assert gpu["util"] > 0.5 and gpu["gpm_sm_active"] > 0.3
    assert verdict["ops"][0]["mfu_dtype"] == "fp16"


def test_launch_bound_without_window_is_host_bound(verdict_of: Callable[[str], Verdict]) -> None:
    """gpu_launch_bound.py under ``--window off``: thousands of tiny kernels a step; with NVML
    alone, the GPU idles while the host launches (that host time counts as compute)."""
    verdict = verdict_of("launch_bound-nowindow")
    assert verdict["bottleneck"] == "compute"
    assert not verdict["probes"]["torch_ops"]["ok"] and not verdict["probes"]["stacks"]["ok"]
    assert "window off" in verdict["probes"]["torch_ops"]["reason"]
    assert any(n.startswith("No profiler window on rank 0") for n in verdict["notes"])
    assert "ops" not in verdict  # no trace: no op table
    assert not {i for i in ids(verdict) if i.startswith("ops.")}

    host = finding(verdict, "gpu.host_bound")
    assert host["severity"] == "critical"
    assert host["evidence"]["gpu_idle_share"] > 0.5 and host["evidence"]["input_share"] < 0.05
    assert any("CUDA graph" in fix["title"] for fix in host["fixes"]), host["fixes"]

    [gpu] = verdict["gpus"]
    assert gpu["util"] < 0.5 and gpu["samples"] >= 10
    assert 1.0 - gpu["util"] == pytest.approx(host["evidence"]["gpu_idle_share"], abs=0.05)


def test_memory_creep_on_the_gpu(verdict_of: Callable[[str], Verdict]) -> None:
    """memory_creep.py --device cuda: every step's graph stays alive through a summed tensor."""
    verdict = verdict_of("memory-memory_creep")
    creep = finding(verdict, "memory.creep")
    ev = creep["evidence"]
    assert ev["source"] == "CUDA allocated" and ev["ranks_growing"] == 1
    assert ev["bytes_per_step"] == pytest.approx(CREEP_EXPECTED_BYTES, rel=0.2)
    assert any(fix.get("frees_bytes", 0) > 0 for fix in creep["fixes"]), creep["fixes"]

    [rank] = verdict["memory"]["ranks"]
    growth = rank["growth"]
    assert growth is not None and growth["r2"] > 0.9
    assert growth["bytes_per_step"] == pytest.approx(ev["bytes_per_step"])
    assert growth["end_bytes"] > growth["start_bytes"]
    assert rank["parameters_bytes"] > 0 and rank["activations_bytes"] > 0
    assert rank["optimizers"], rank

    # the flat runs do not creep
    for name in ("pageable_copy", "conv_layout", "launch_bound-nowindow"):
        assert verdict_of(name)["memory"]["ranks"][0]["growth"] is None, name
        assert not findings(verdict_of(name), "memory.creep"), name


def test_a_step_captured_as_a_cuda_graph_counts_each_replay(
        verdict_of: Callable[[str], Verdict]) -> None:
    """gpu_launch_bound --fixed replays the whole step as one CUDA graph: no optimizer step in
    Python after the capture. The replays are the steps (the job printed 4701 steps, median
    2.094 ms), and kernels replayed from a graph are not launch-bound."""
    verdict = verdict_of("launch_bound-fixed")
    assert verdict["steps"]["count"] >= 4600
    assert verdict["steps"]["median_s"] == pytest.approx(0.0020937, rel=0.05)
    assert "gpu.launch_bound" not in ids(verdict)


def test_launch_bound_with_the_window_names_the_launches(
        verdict_of: Callable[[str], Verdict]) -> None:
    """gpu_launch_bound.py under the window, recorded after the window learned to let go of
    CUPTI (the job printed 15.43 ms a step, 15.35 ms without doctor, 2.105 ms as a CUDA graph):
    the launches are named, the estimate stays under what the graph gave, and the steps after
    the window are as fast as those before it (with CUPTI left attached they took 1.37x)."""
    verdict = verdict_of("launch_bound")
    launch = finding(verdict, "gpu.launch_bound")
    assert 1.5 < launch["estimated_speedup"] <= measured_speedup("launch_bound")
    assert verdict["steps"]["median_s"] == pytest.approx(MEASURED["launch_bound"][0], rel=0.1)
    assert not any("drift" in i for i in ids(verdict)), ids(verdict)


@pytest.mark.parametrize("name", ["amp-grad", "amp-output"])
def test_skipped_iterations_and_where_they_overflow_on_the_gpu(
        verdict_of: Callable[[str], Verdict], name: str) -> None:
    """amp_skips.py --device cuda --layers 3 --overflow-at 1: autocast and a GradScaler on the
    GPU, every third iteration overflowing in fc1 (its output's gradient, or its output in the
    forward pass); the losses and the watch's flags read late behind CUDA events."""
    verdict = verdict_of(name)
    share, nonfinite = AMP_JOB[name]
    skipped = finding(verdict, "steps.skipped")["evidence"]
    assert (skipped["skipped"], skipped["iterations"]) == (100, 300)
    assert skipped["wasted_share"] == pytest.approx(share, rel=0.25)
    if name == "amp-grad":
        assert skipped["overflow_layer"] == "fc1 (Linear)" and skipped["nonfinite_losses"] == 0
    else:  # recorded before 97cd0ad: the last loss, read as doctor closed, was lost
        assert skipped["overflow_forward_layer"] == "fc1 (Linear)"
        assert nonfinite - 1 <= skipped["nonfinite_losses"] <= nonfinite
    assert skipped["overflow_read"] == 3
    # the job reads its loss (.item()) every iteration: the host waits for the GPU
    assert "gpu.host_sync" in ids(verdict)
