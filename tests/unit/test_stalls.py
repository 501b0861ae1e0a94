"""A step many times the median (a hang) is named with its time and its share of the run,
wherever it falls: among the analysed steps, in the profiler window or in the stack sampling
span, whose steps the shares leave out (doctor.analyse.stalls)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from doctor.analyse.stalls import (
    ANALYSED,
    IN_WINDOW,
    SAMPLING,
    find_stalls,
    stall_findings,
    stall_notes,
    warmup_notes,
)


def table(walls: list[float], *, window: range = range(0), sampled: range = range(0),
          warm: int = 3) -> pd.DataFrame:
    n = len(walls)
    step = np.arange(1, n + 1)
    in_window = np.isin(step, list(window))
    is_sampled = np.isin(step, list(sampled))
    warmup = step <= warm
    return pd.DataFrame({
        "rank": 0, "step": step, "wall_s": walls, "warmup": warmup, "in_window": in_window,
        "window_close": np.zeros(n, bool), "sampled": is_sampled, "in_range": True,
        "analyzed": ~warmup & ~in_window & ~is_sampled})


def test_a_long_step_is_found_wherever_it_falls() -> None:
    walls = [2.0, 0.3] + [0.05] * 98
    walls[9], walls[29], walls[79] = 4.0, 5.0, 60.0  # window, sampling, analysed
    found = find_stalls(table(walls, window=range(8, 13), sampled=range(13, 60)), run_s=80.0)
    assert [(s.step, s.where) for s in found] == [(80, ANALYSED), (30, SAMPLING),
                                                  (10, IN_WINDOW)]
    assert found[0].share == pytest.approx(0.75) and found[0].times_median == pytest.approx(1200)
    findings = stall_findings(found)
    assert findings[0].severity == "warning" and "Step 80" in findings[0].title
    assert "75% of the run" in findings[0].title
    assert [f.severity for f in findings[1:]] == ["info", "info"]
    notes = stall_notes(found)
    assert "Step 10 took 4.0 s" in notes[0] and "profiler window" in notes[0]
    assert "left out of the shares" in notes[1] and "counts in the shares" in notes[2]


def test_warm_up_and_ordinary_steps_are_not_stalls() -> None:
    walls = [30.0, 5.0, 2.0] + [0.5] * 50  # compilation, then steady
    walls[20] = 0.9  # slower, not a stall
    assert find_stalls(table(walls)) == []
    # short steps: ten times the median but under a second is not a stall either
    assert find_stalls(table([0.01] * 20 + [0.5] + [0.01] * 20)) == []


def test_a_long_warm_up_is_said_though_it_is_no_stall() -> None:
    walls = [1.0, 40.0, 2.0] + [0.05] * 100
    assert find_stalls(table(walls)) == []
    (note,) = warmup_notes(table(walls), run_s=60.0)
    assert "took 43.0 s (72% of the run; step 2 40.0 s)" in note
    assert warmup_notes(table([1.0, 0.5, 0.2] + [0.05] * 100), run_s=60.0) == []


def test_doctor_s_own_export_is_not_the_job_s_stall() -> None:
    walls = [0.05] * 60
    walls[12] = 4.0  # the window's closing step: 3.95 s of it is the trace export
    own = np.zeros(60)
    own[12] = 3.95
    assert find_stalls(table(walls, window=range(8, 14)), {0: own}) == []
    assert len(find_stalls(table(walls, window=range(8, 14)))) == 1


