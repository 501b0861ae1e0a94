"""The verdict of recorded runs (fake clock, no job): categories, shares, partial runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from doctor.outputs import finalize_run
from doctor.pipeline import analyze_run
from doctor.verdict import CATEGORIES, check_verdict
from tests.support import record_loop, write_record


def test_input_bound_run(tmp_path: Path) -> None:
    record_loop(tmp_path, 40, wait_s=0.09, compute_s=0.01)
    write_record(tmp_path, cores=8)
    verdict = analyze_run(tmp_path).verdict
    assert verdict.bottleneck == "input"  # no stack samples: the wait cannot be split
    assert verdict.shares["input"] == pytest.approx(0.9, abs=0.01)
    assert verdict.shares["preprocess"] == 0
    assert verdict.steps["count"] == 39
    assert verdict.steps["analyzed"] < 39  # warm-up left out
    ids = [f.id for f in verdict.findings]
    assert ids[:2] == ["input.loader", "input.unsplit"]
    assert "set num_workers=7" in verdict.findings[0].fixes[0].title
    assert not verdict.partial
    assert any("warm-up" in n for n in verdict.notes)


def test_compute_bound_run(tmp_path: Path) -> None:
    record_loop(tmp_path, 40, wait_s=0.001, compute_s=0.05)
    write_record(tmp_path)
    verdict = analyze_run(tmp_path).verdict
    assert verdict.bottleneck == "compute"
    assert verdict.shares["compute"] > 0.95
    assert "compute.bound" in [f.id for f in verdict.findings]
    assert abs(sum(verdict.shares.values()) - 1) < 1e-6
    assert set(CATEGORIES) <= set(verdict.shares)


def test_a_run_that_crashed_is_partial_and_says_so(tmp_path: Path) -> None:
    record_loop(tmp_path, 25, wait_s=0.01, compute_s=0.02)
    write_record(tmp_path, exit_code=1)
    verdict = analyze_run(tmp_path).verdict
    assert verdict.partial
    assert any("exited with status 1" in n for n in verdict.notes)
    assert verdict.bottleneck == "input"  # a third of the step waits: stall-first, as any door


def test_a_killed_run_is_partial(tmp_path: Path) -> None:
    record_loop(tmp_path, 25)
    write_record(tmp_path, exit_code=137, signal=9)
    verdict = analyze_run(tmp_path).verdict
    assert verdict.partial
    assert any("signal 9" in n for n in verdict.notes)


def test_no_steps_means_unknown_with_the_reason(tmp_path: Path) -> None:
    write_record(tmp_path)
    verdict = analyze_run(tmp_path).verdict
    assert verdict.bottleneck == "unknown"
    assert verdict.findings[0].id == "steps.none"
    assert "doctor.step()" in verdict.findings[0].fixes[0].code
    assert all(v == 0 for v in verdict.shares.values())


def test_finalize_writes_a_valid_verdict_and_a_report(tmp_path: Path) -> None:
    record_loop(tmp_path, 30, wait_s=0.02, compute_s=0.02)
    write_record(tmp_path, probes={"gpu": {"ok": False, "reason": "NVML library not found"}})
    finalize_run(tmp_path)
    data = json.loads((tmp_path / "verdict.json").read_text())
    check_verdict(data)
    assert data["probes"]["gpu"] == {"ok": False, "reason": "NVML library not found"}
    assert data["job"]["argv"] == ["python", "train.py"]
    html = (tmp_path / "report.html").read_text()
    assert "NVML library not found" in html


def test_few_steps_are_all_counted_with_a_note(tmp_path: Path) -> None:
    record_loop(tmp_path, 3, wait_s=0.02, compute_s=0.02)
    write_record(tmp_path)
    verdict = analyze_run(tmp_path).verdict
    assert verdict.steps["count"] == 2
    assert verdict.steps["analyzed"] >= 1
    assert any("firmer verdict" in n for n in verdict.notes)


def test_run_queue_delay_next_to_busy_workers_is_loading_contention(tmp_path: Path) -> None:
    import numpy as np
    import pandas as pd

    from doctor.analyse.contention import INPUT, core_contention
    from doctor.analyse.steps import RankSteps

    none = np.zeros(0, dtype=np.int64)
    ranks = {0: RankSteps(0, 0, 100, "optimizer", none, none)}
    workers = {0: [101, 102]}
    t = [float(i) for i in range(11)]
    host = pd.DataFrame({
        "node": 0, "t_s": t * 3, "pid": [100] * 11 + [101] * 11 + [102] * 11,
        # the training process: 0.6 cores, 0.2 s of each second runnable without a core
        "cpu_s": [0.6 * x for x in t] + [0.7 * x for x in t] * 2,
        "run_delay_s": [0.2 * x for x in t] + [0.1 * x for x in t] * 2,
    })
    system = pd.DataFrame({"node": 0, "t_s": t, "busy_cores": [2.0] * 11})
    ledger = pd.DataFrame({"rank": [0] * 10, "analyzed": [True] * 10,
                           "wall_s": [0.1] * 10, "wait_s": [0.05] * 10})
    got = core_contention(host, system, ledger, workers, ranks, (0.0, 10.0))
    # 0.2 s a second over 0.5 s of rest: 40 %; the workers are all the competing load
    assert got[0][INPUT] == pytest.approx(0.4, abs=0.01)
    # other load on the machine takes its part: the workers' 1.4 of 2.8 competing cores
    busy = pd.DataFrame({"node": 0, "t_s": t, "busy_cores": [3.4] * 11})
    got = core_contention(host, busy, ledger, workers, ranks, (0.0, 10.0))
    assert got[0][INPUT] == pytest.approx(0.2, abs=0.01)
    # no workers, no contention from loading
    assert core_contention(host, system, ledger, {0: []}, ranks, (0.0, 10.0)) == {}
    # the same pids on another node are another node's processes, not this rank's workers
    elsewhere = host.assign(node=[0] * 11 + [1] * 22)
    assert core_contention(elsewhere, system, ledger, workers, ranks, (0.0, 10.0)) == {}


def test_run_queue_delay_next_to_busy_communication_threads_is_communication() -> None:
    import numpy as np
    import pandas as pd

    from doctor.analyse.contention import COMMUNICATION, INPUT, core_contention
    from doctor.analyse.steps import RankSteps

    none = np.zeros(0, dtype=np.int64)
    ranks = {0: RankSteps(0, 0, 100, "optimizer", none, none),
             1: RankSteps(1, 0, 200, "optimizer", none, none)}
    t = [float(i) for i in range(11)]
    host = pd.DataFrame({
        "node": 0, "t_s": t * 2, "pid": [100] * 11 + [200] * 11,
        # each rank: 1.0 core, of which its gloo threads 0.4; 0.25 s of each second runnable
        # without a core
        "cpu_s": [1.0 * x for x in t] * 2, "comm_cpu_s": [0.4 * x for x in t] * 2,
        "run_delay_s": [0.25 * x for x in t] * 2,
    })
    system = pd.DataFrame({"node": 0, "t_s": t, "busy_cores": [2.0] * 11})
    ledger = pd.DataFrame({"rank": [0] * 10 + [1] * 10, "analyzed": [True] * 20,
                           "wall_s": [0.1] * 20, "wait_s": [0.0] * 20})
    got = core_contention(host, system, ledger, {}, ranks, (0.0, 10.0))
    # 25 % of the rest runnable without a core; competing: 2 - 0.6 training = 1.4 cores, of
    # which the two ranks' gloo threads 0.8
    assert got[0][COMMUNICATION] == pytest.approx(0.25 * 0.8 / 1.4, abs=0.01)
    assert INPUT not in got[0]
    # without communication threads (no comm_cpu_s), the delay is no one's cost but the rest's
    assert core_contention(host.drop(columns="comm_cpu_s"), system, ledger, {}, ranks,
                           (0.0, 10.0)) == {}


def test_a_step_range_analyses_only_its_steps(tmp_path: Path) -> None:
    # 60 input-bound steps, then 60 compute-bound ones (the loader got fixed mid-run)
    record_loop(tmp_path, 60, wait_s=0.09, compute_s=0.01, then=(60, 0.001, 0.05))
    write_record(tmp_path, cores=8)
    whole = analyze_run(tmp_path)
    first = analyze_run(tmp_path, (None, 55))
    second = analyze_run(tmp_path, (65, None))
    assert first.verdict.bottleneck == "input"
    assert first.verdict.shares["input"] == pytest.approx(0.9, abs=0.01)
    assert second.verdict.bottleneck == "compute"
    assert second.verdict.shares["compute"] > 0.95
    assert 0.3 < whole.verdict.shares["input"] < 0.7
    assert first.verdict.steps["range"] == [1, 55]
    assert second.verdict.steps["range"] == [65, 119]
    assert "range" not in whole.verdict.steps
    # the ledger keeps every step; only the range is analysed
    assert len(first.ledger) == len(whole.ledger) == 119
    assert first.ledger.loc[first.ledger["analyzed"], "step"].max() <= 55
    assert any("steps 1-55 of 119" in n for n in first.verdict.notes)


def test_a_step_range_past_the_run_is_a_usage_error(tmp_path: Path) -> None:
    from doctor.errors import UsageError

    record_loop(tmp_path, 30)
    write_record(tmp_path)
    with pytest.raises(UsageError, match="from step 200: the run has 29 steps per rank"):
        analyze_run(tmp_path, (200, 300))
