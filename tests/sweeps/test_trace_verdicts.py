"""Verdicts on the real Kineto traces in ../shared/traces agree with that folder's README."""

from __future__ import annotations

import functools
import gzip
import json
from pathlib import Path

import pytest

from doctor.analyse.analysis import Analysis
from doctor.analyse.bottleneck import choose_bottleneck
from doctor.pipeline import analyze_traces
from doctor.trace.reader import TraceError
from doctor.verdict import CATEGORIES, LEDGER_COLUMNS, check_verdict
from tests.support import SHARED_TRACES

needs_traces = pytest.mark.skipif(
    not SHARED_TRACES.is_dir(),
    reason=f"the recorded GPU traces are not here ({SHARED_TRACES}); they live outside the "
    "repository",
)


@functools.cache
def analyse(*names: str) -> Analysis:
    paths = [SHARED_TRACES / n for n in names]
    for p in paths:
        if not p.exists():
            pytest.skip(f"{p} is absent")
    return analyze_traces(paths)


def finding_ids(a: Analysis) -> set[str]:
    return {f.id for f in a.verdict.findings}


def check_contract(a: Analysis) -> dict[str, float]:
    data = a.verdict.to_dict()
    check_verdict(data)
    shares = data["shares"]
    assert set(CATEGORIES) <= set(shares)
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-3)
    assert set(LEDGER_COLUMNS) <= set(a.ledger.columns)
    json.dumps(data)
    return {k: float(v) for k, v in shares.items()}


# file -> (bottleneck, findings that must be there)
EXPECTED = {
    "resnet50_v100_num_workers_0.pt.trace.json.gz": ("input", {"input.unsplit",
                                                               "gpu.pageable_copy"}),
    "resnet50_v100_num_workers_4.pt.trace.json.gz": ("compute", {"gpu.pageable_copy"}),
    "resnet_v100_compute.pt.trace.json.gz": ("compute", set()),
    "ddp_v100_rank1_of_2.json.gz": ("compute", {"comm.exposed"}),
    "ddp_a100_rank0_of_2_hostbound.json.gz": ("compute", {"gpu.launch_bound"}),
    "a100_rank0_of_16_pageable.json.gz": ("compute", {"gpu.pageable_copy", "comm.exposed",
                                                      "gpu.launch_bound"}),
    "recsys_a100_rank3_of_8.json.gz": ("compute", {"comm.exposed", "gpu.transfer_exposed"}),
}


@needs_traces
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_gpu_trace_verdicts_agree_with_the_readme(name: str) -> None:
    a = analyse(name)
    bottleneck, must = EXPECTED[name]
    check_contract(a)
    assert a.verdict.bottleneck == bottleneck, a.verdict.shares
    assert must <= finding_ids(a), finding_ids(a)
    assert a.verdict.job["device"] == "cuda"
    assert a.verdict.job["argv"] == [] and a.verdict.job["exit_code"] is None
    assert a.verdict.probes["trace"].ok


@needs_traces
def test_input_share_and_its_finding_on_num_workers_0() -> None:
    a = analyse("resnet50_v100_num_workers_0.pt.trace.json.gz")
    shares = check_contract(a)
    assert 0.18 <= shares["input"] <= 0.3  # README: DataLoader 24 %, 22 % with the GPU idle
    (f,) = [f for f in a.verdict.findings if f.id == "input.unsplit"]
    assert "doctor run" in f.fixes[0].why
    assert f.estimated_speedup is not None and f.estimated_speedup > 1.2
    pageable = next(f for f in a.verdict.findings if f.id == "gpu.pageable_copy")
    assert pageable.evidence["htod_pageable_per_step"] == 2  # 12 copies over 6 steps


@needs_traces
def test_compute_trace_is_nearly_all_compute() -> None:
    shares = check_contract(analyse("resnet_v100_compute.pt.trace.json.gz"))
    assert shares["compute"] > 0.9  # README: kernels 96.5 % busy


@needs_traces
def test_ddp_v100_communication_is_exposed_and_not_overlapped() -> None:
    a = analyse("ddp_v100_rank1_of_2.json.gz")
    shares = check_contract(a)
    assert 0.15 <= shares["communication"] <= 0.3  # README: NCCL 21 %, none overlapped
    comm = next(f for f in a.verdict.findings if f.id == "comm.exposed")
    assert comm.evidence["comm_overlapped_fraction"] < 0.05
    assert comm.evidence["world_size"] == 2


@needs_traces
def test_hostbound_trace_is_launch_bound() -> None:
    a = analyse("ddp_a100_rank0_of_2_hostbound.json.gz")
    f = next(f for f in a.verdict.findings if f.id == "gpu.launch_bound")
    assert f.evidence["gpu_busy_share"] < 0.35  # README: kernels 17 %, NCCL 7 %


@needs_traces
def test_two_sampled_ranks_merge_into_a_communication_verdict() -> None:
    a = analyse("recsys_128_ranks_sampled/rank-0.json.gz",
                "recsys_128_ranks_sampled/rank-1.json.gz")
    shares = check_contract(a)
    assert a.verdict.bottleneck == "communication"
    assert 0.2 <= shares["communication"] <= 0.35  # README: 25-27 % exposed
    assert a.verdict.job["ranks"] == 2
    assert a.verdict.job["world_size"] == 128
    assert set(a.ledger["rank"]) == {0, 1}
    assert "comm.exposed" in finding_ids(a)


@needs_traces
def test_cpu_only_gloo_trace_gives_a_cpu_verdict() -> None:
    a = analyse("edge/cpu_only_gloo.json.gz")
    check_contract(a)
    assert a.verdict.job["device"] == "cpu"
    assert "trace.cpu_only" in finding_ids(a)
    assert a.verdict.bottleneck == "communication"  # gloo all-reduce fills the step


@needs_traces
@pytest.mark.parametrize("name", ["edge/rank_non_gpu.json.gz", "edge/no_distributed_info.json.gz",
                                  "edge/large_integer.json.gz", "edge/rocm_mi250_toy.json.gz"])
def test_edge_traces_do_not_crash(name: str) -> None:
    a = analyse(name)
    check_contract(a)
    assert a.verdict.bottleneck != "unknown"
    assert a.verdict.job["ranks"] == 1


@needs_traces
def test_rocm_gpu_work_is_recognised() -> None:
    a = analyse("edge/rocm_mi250_toy.json.gz")
    frame = a.tables.gpu_steps
    assert frame is not None
    assert a.verdict.job["device"] == "cuda"
    assert frame["kernel_count"].sum() == 14
    assert frame["launch_count"].sum() == 14
    assert frame["htod_s"].sum() > 0


def test_no_steps_gives_unknown_with_a_reason(tmp_path: Path) -> None:
    path = tmp_path / "empty.json.gz"
    with gzip.open(path, "wt") as fh:
        json.dump({"schemaVersion": 1, "traceEvents": [{"ph": "M", "name": "process_name"}]}, fh)
    a = analyze_traces([path])
    data = a.verdict.to_dict()
    check_verdict(data)
    assert data["bottleneck"] == "unknown"
    assert [f["id"] for f in data["findings"]] == ["steps.none"]  # the same id as a run's
    assert "prof.step()" in data["findings"][0]["fixes"][0]["code"]
    assert a.ledger.empty


def test_a_broken_trace_raises_trace_error(tmp_path: Path) -> None:
    path = tmp_path / "cut.json"
    path.write_text('{"traceEvents": [{"ph": "X", "ts": 1')
    with pytest.raises(TraceError, match="truncated"):
        analyze_traces([path])


@pytest.mark.parametrize(("shares", "device_compute", "expected"), [
    ({"input": 0.24, "compute": 0.73}, 0.49, "input"),
    ({"transfer": 0.3, "compute": 0.7}, 0.6, "transfer"),
    ({"communication": 0.2, "compute": 0.72}, 0.6, "compute"),
    ({"communication": 0.26, "compute": 0.4, "other": 0.34}, 0.2, "communication"),
    ({"communication": 0.1, "compute": 0.0, "other": 0.9}, 0.0, "communication"),
    ({"compute": 0.0, "other": 1.0}, 0.0, "unknown"),
    # the input pipeline is one stall, named by its largest stage
    ({"io": 0.18, "preprocess": 0.34, "compute": 0.48}, 0.48, "preprocess"),
    ({"io": 0.05, "decode": 0.06, "preprocess": 0.05, "compute": 0.5, "other": 0.34}, 0.5,
     "compute"),
    ({"transfer": 0.25, "compute": 0.60, "other": 0.15}, 0.60, "transfer"),
    # communication from 30 %, or from 20 % when at least the device's own compute
    ({"communication": 0.31, "compute": 0.6, "other": 0.09}, 0.6, "communication"),
    ({"communication": 0.22, "compute": 0.7, "other": 0.08}, 0.6, "compute"),
    # the larger of two qualifying stalls
    ({"input": 0.25, "transfer": 0.3, "compute": 0.45}, 0.45, "transfer"),
])
def test_bottleneck_policy(shares: dict[str, float], device_compute: float, expected: str) -> None:
    bottleneck, share = choose_bottleneck(shares, device_compute)
    assert bottleneck == expected
    if expected in ("io", "decode", "preprocess", "input") and share >= 0.2:
        assert share == pytest.approx(sum(shares.get(c, 0.0) for c in
                                          ("io", "decode", "preprocess", "input")))
