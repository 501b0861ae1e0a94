"""Periods (doctor.analyse.periods): a run with a later window is analysed period by period, each
later period split by its own window, and the verdict's ``periods`` names each period's
bottleneck; the report says so where they differ, and nothing where they agree. Recorded through
a real Session on a fake clock."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from doctor.analyse.ledger import build_ledger
from doctor.analyse.periods import PeriodStart, ledger_by_period
from doctor.analyse.window import WindowSplit
from doctor.pipeline import analyze_run
from doctor.reports.text import render_text
from doctor.verdict import Verdict
from tests.support import DATA_TRACES, record_loop, write_record


def record_two_periods(run_dir: Path, *, later_at: int = 200, wait_after_s: float = 0.06
                       ) -> None:
    """A loop of 40 ms steps with no input wait; from step 180 on, each batch waits
    ``wait_after_s`` (the input slowed down). The first window opens at step 8, the second at
    ``later_at``."""
    record_loop(run_dir, 180, wait_s=0.001, compute_s=0.04, then=(120, wait_after_s, 0.04),
                windows=(8, later_at))
    write_record(run_dir, t0_monotonic_s=0.0)


def test_two_windows_give_two_periods_with_their_bottlenecks(tmp_path: Path) -> None:
    record_two_periods(tmp_path)
    verdict = analyze_run(tmp_path).verdict
    first, later = verdict.periods
    assert (first["first_step"], first["window"]) == (1, 1)
    assert later["window"] == 2 and later["first_step"] == first["last_step"] + 1
    assert 195 <= later["first_step"] <= 205
    assert first["bottleneck"] == "compute"
    assert later["bottleneck"] in ("input", "io", "decode", "preprocess")
    assert later["bottleneck_share"] > 0.5  # 60 ms of 100 ms waits
    # the steps 180-199 waited too: the first period is compute, but not all of it
    assert first["shares"]["compute"] > later["shares"]["compute"]
    text = render_text(analyze_run(tmp_path), full=True)
    assert "from step" in text and "Periods" in text
    # in verdict.json, and read back
    data = verdict.to_dict()
    assert Verdict.from_dict(json.loads(json.dumps(data))).periods == data["periods"]


def test_periods_that_agree_say_nothing_extra(tmp_path: Path) -> None:
    record_two_periods(tmp_path, wait_after_s=0.001)
    analysis = analyze_run(tmp_path)
    assert [p["bottleneck"] for p in analysis.verdict.periods] == ["compute", "compute"]
    assert "Periods" not in render_text(analysis, full=True)


def test_periods_in_a_row_that_agree_are_said_as_one() -> None:
    from doctor.reports.periods import period_line

    def period(first: int, last: int, bottleneck: str, share: float, seconds: float
               ) -> dict[str, object]:
        return {"first_step": first, "last_step": last, "bottleneck": bottleneck,
                "bottleneck_share": share, "analysed_s": seconds}

    verdict = Verdict("compute", {}, {}, [], {}, {}, periods=[
        period(1, 99, "compute", 0.9, 10.0), period(100, 199, "compute", 0.6, 10.0),
        period(200, 300, "io", 0.5, 5.0)])
    assert period_line(verdict) == (
        "Periods (a later profiler window opened where the run slowed down): "
        "steps 1-199: compute, 75%; from step 200: io, 50%")
    verdict.periods = verdict.periods[:2]
    assert period_line(verdict) is None


def test_one_window_has_no_periods(tmp_path: Path) -> None:
    record_two_periods(tmp_path, later_at=10**6)
    verdict = analyze_run(tmp_path).verdict
    assert verdict.periods == []
    assert "periods" not in verdict.to_dict()


def test_a_later_window_splits_its_own_period() -> None:
    """The first window says compute, the second communication: the second period's steps
    are split by the second window's fractions, the first's by the first's."""
    import numpy as np
    import pandas as pd

    from doctor.analyse.step_table import empty_step_table

    n = 20
    columns = empty_step_table().dtypes
    full = pd.DataFrame({c: np.full(n, np.nan) if t.kind == "f" else np.zeros(n, dtype=t)
                         for c, t in columns.items()})
    full = full.assign(rank=0, step=np.arange(1, n + 1), start_s=0.1 * np.arange(n),
                       wall_s=0.1, wait_s=0.0, backward_s=0.0, optimizer_s=0.0, fetch_s=0.0,
                       analyzed=True, in_range=True)
    compute = WindowSplit({"transfer": 0.0, "compute": 1.0, "communication": 0.0,
                           "other": 0.0}, "cpu", 1.0)
    comm = WindowSplit({"transfer": 0.0, "compute": 0.25, "communication": 0.75,
                        "other": 0.0}, "cpu", 0.25)
    ledger = build_ledger(full, {0: compute})
    out = ledger_by_period(ledger, full, {0: [PeriodStart(0, 2, 11)]}, {0: {2: comm}}, {},
                           {0: compute}, lambda t, w, _inputs: build_ledger(t, w))
    assert list(out["step"]) == list(range(1, n + 1))
    before, after = out[out["step"] < 11], out[out["step"] >= 11]
    assert before["compute"].sum() == pytest.approx(1.0)
    assert after["communication"].sum() == pytest.approx(0.75)
    assert after["compute"].sum() == pytest.approx(0.25)


def test_later_traces_are_read_each_with_its_number(tmp_path: Path) -> None:
    """A process folder with trace.json.gz, trace-2.json.gz and stacks-2.txt: the second trace is
    the later windows' frame, with its number, the first stays the window's; the stacks beside
    the second window are the later stacks'."""
    record_two_periods(tmp_path)
    [proc] = list(tmp_path.glob("rank-0/main-*"))
    cpu = DATA_TRACES / "elementwise_bound.json.gz"  # a CPU job's window
    shutil.copy(cpu, proc / "trace.json.gz")
    shutil.copy(cpu, proc / "trace-2.json.gz")
    from doctor.store.reader import load_run
    from doctor.store.stacks import write_stacks_meta

    stack = "thread (1): MainThread;train (train.py:3);__getitem__ (train.py:9) 7\n"
    (proc / "stacks-2.txt").write_text(stack)
    write_stacks_meta(proc, recorder="py-spy", rate_hz=50, start_ns=0, end_ns=10**9, taken=7,
                      window=2)
    run = load_run(tmp_path)
    assert len(run.window) and len(run.later_windows) == len(run.window)
    assert set(run.later_windows["window"]) == {2}
    assert run.stacks.empty and run.stack_spans.empty  # the first window's: none here
    assert list(run.later_stacks["count"]) == [7] and set(run.later_stacks["window"]) == {2}
    assert list(run.later_stack_spans["taken"]) == [7]
