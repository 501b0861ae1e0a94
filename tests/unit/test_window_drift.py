"""The steps before the profiler window against the steps after it (issue 32, item 10): the
analysis flags a job whose steps run much faster after the window (the allocator's threshold,
moved by the window's own allocations), and says so in the verdict with a fix ``doctor try`` can
measure; a job whose steps keep their pace, or that has too few steps on a side, is not flagged.
Recorded through a real Session on a fake clock: proportions, no wall-clock time."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from doctor.analyse.evidence import Evidence
from doctor.analyse.stages import JobFacts
from doctor.analyse.window_drift import MIN_BEFORE, WindowDrift, drift_notes, window_drift
from doctor.pipeline import analyze_run
from doctor.record.session import (
    EVENT_WINDOW_START,
    EVENT_WINDOW_STOP_BEGIN,
    EVENT_WINDOW_STOP_END,
    Session,
)
from doctor.rules.allocator import ENV, page_faults
from tests.support import FakeClock, write_record


def record_window_loop(run_dir: Path, before_s: float, after_s: float, steps: int = 40,
                       start: int = 8, window: int = 5) -> None:
    """A loop whose steps take ``before_s`` until the window opens at step ``start`` and
    ``after_s`` once it has closed (a small jitter, as real steps have)."""
    clock = FakeClock()
    s = Session(run_dir, clock=clock, window_start=10**9)
    for i in range(steps):
        if i == start:
            s.record_event(EVENT_WINDOW_START)
        if i == start + window:
            s.record_event(EVENT_WINDOW_STOP_BEGIN)
            clock.tick(0.2)  # the export
            s.record_event(EVENT_WINDOW_STOP_END)
        step_s = before_s if i < start else after_s
        clock.tick(step_s * (1 + 0.02 * (i % 3)))
        s.record_optimizer_start()
        s.record_optimizer_end(0)
    s.close()
    write_record(run_dir, t0_monotonic_s=0.0)


def test_steps_much_faster_after_the_window_are_flagged_in_the_verdict(tmp_path: Path) -> None:
    record_window_loop(tmp_path, before_s=0.10, after_s=0.075)  # 25 % faster after
    analysis = analyze_run(tmp_path)
    [drift] = window_drift(analysis.ledger)
    assert drift.faster and not drift.slower
    assert drift.steps_before >= MIN_BEFORE
    assert 0.70 < drift.ratio < 0.80
    ids = [f.id for f in analysis.verdict.findings]
    assert "allocator.page_faults" in ids
    finding = next(f for f in analysis.verdict.findings if f.id == "allocator.page_faults")
    assert finding.fixes[0].apply == {"env": ENV}
    assert any("after the profiler window ran" in n and "faster" in n
               for n in analysis.verdict.notes)


def test_steps_that_keep_their_pace_are_not_flagged(tmp_path: Path) -> None:
    record_window_loop(tmp_path, before_s=0.10, after_s=0.098)  # a small job's: noise
    analysis = analyze_run(tmp_path)
    [drift] = window_drift(analysis.ledger)
    assert not drift.faster and not drift.slower
    assert "allocator.page_faults" not in [f.id for f in analysis.verdict.findings]
    assert not any("after the profiler window ran" in n for n in analysis.verdict.notes)


def ledger(before: list[float], after: list[float], warmup: int = 3) -> pd.DataFrame:
    """A made-up ledger: ``warmup`` warm-up steps, ``before``, a window of 5 steps and its
    closing step, ``after``."""
    walls = [1.0] * warmup + before + [0.5] * 6 + after
    n = len(walls)
    first_window = warmup + len(before)
    rows = {
        "rank": [0] * n, "step": list(range(1, n + 1)), "wall_s": walls,
        "warmup": [i < warmup for i in range(n)],
        "in_window": [first_window <= i < first_window + 5 for i in range(n)],
        "window_close": [i == first_window + 5 for i in range(n)],
    }
    frame = pd.DataFrame(rows)
    frame["analyzed"] = ~(frame["warmup"] | frame["in_window"] | frame["window_close"])
    return frame


def test_window_drift_on_a_made_up_ledger() -> None:
    [faster] = window_drift(ledger([0.10, 0.11, 0.10, 0.105], [0.07] * 20))
    assert faster.faster and faster.ratio < 0.7
    [slower] = window_drift(ledger([0.10, 0.11, 0.10, 0.105], [0.14] * 20))
    assert slower.slower and not slower.faster
    assert "slower" in drift_notes((slower,))[0]
    # within the spread of the steps before the window: not beyond noise
    [spread] = window_drift(ledger([0.10, 0.06, 0.10, 0.10], [0.08] * 20))
    assert not spread.faster
    # too few steps before the window (a window at step 4): nothing to compare
    assert window_drift(ledger([0.10], [0.07] * 20)) == ()
    # no window
    plain = ledger([0.10] * 4, [0.07] * 20)
    plain["in_window"] = plain["window_close"] = False
    assert window_drift(plain) == ()


def drift(ratio: float) -> WindowDrift:
    return WindowDrift(0, 0.1, 0.1 * ratio, 4, 20, 0.099, 0.11)


def test_the_allocator_rule_on_made_up_drifts() -> None:
    [finding] = page_faults(Evidence(job=JobFacts(device="cpu"), window_drift=(drift(0.75),)))
    assert finding.estimated_speedup is not None and 1.3 < finding.estimated_speedup < 1.4
    assert finding.fixes[0].apply == {"env": {"MALLOC_MMAP_THRESHOLD_": "33554432",
                                              "MALLOC_TRIM_THRESHOLD_": "67108864"}}
    assert page_faults(Evidence(job=JobFacts(device="cpu"), window_drift=(drift(0.95),))) == []
    assert page_faults(Evidence(job=JobFacts(device="cpu"), window_drift=(drift(1.3),))) == []
    # a GPU job's tensors live in the CUDA caching allocator, not glibc's
    assert page_faults(Evidence(job=JobFacts(device="cuda"),
                                window_drift=(drift(0.75),))) == []


def test_the_allocator_rule_on_steady_page_faults() -> None:
    """The window aside: a job that still pays many page faults a step after it gets the
    finding (its bare run pays them too); one with few does not."""
    many = WindowDrift(0, 0.38, 0.38, 4, 20, 0.37, 0.40, 12_000.0, 11_000.0)
    [finding] = page_faults(Evidence(job=JobFacts(device="cpu"), window_drift=(many,)))
    assert finding.title.startswith("Each step pays 11000 page faults")
    assert finding.estimated_speedup is not None and finding.estimated_speedup > 1.0
    assert finding.fixes[0].apply == {"env": ENV}
    few = WindowDrift(0, 0.38, 0.38, 4, 20, 0.37, 0.40, 300.0, 20.0)
    assert page_faults(Evidence(job=JobFacts(device="cpu"), window_drift=(few,))) == []
