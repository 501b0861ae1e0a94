"""Slow steps no cause explains: what the training thread did in their extra time (blocked,
on a core, waiting for one) and whether they come every N steps, in steps.spikes' words and
fixes (doctor.analyse.spike_content, doctor.rules.other)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from doctor.analyse.spike_content import spike_content
from doctor.rules.other import CORES, PERIODIC, WAITS, other_time
from doctor.verdict import CATEGORIES, Finding
from tests.support import evidence

STEP_S, SPIKE_S = 0.1, 1.0


def ledger(spike_at: list[int], state: str | None, n: int = 200, sampler: float = 0.0
           ) -> pd.DataFrame:
    """One rank's steps of STEP_S (on a core 80 %, blocked 20 %); the steps ``spike_at`` last
    SPIKE_S more, spent in ``state`` (None: not measured)."""
    rows = []
    for i in range(n):
        extra = SPIKE_S if i in spike_at else 0.0
        thread = {"running_s": 0.08, "runnable_s": 0.0, "blocked_s": 0.02 + sampler}
        if extra and state is not None:
            thread[f"{state}_s"] += extra
        row = dict.fromkeys(CATEGORIES, 0.0)
        row.update(compute=STEP_S, other=extra)
        rows.append({"rank": 0, "step": i + 1, "start_s": float(i), "wall_s": STEP_S + extra,
                     **row, "warmup": False, "analyzed": True, "sampler_s": sampler,
                     **({k: np.nan for k in thread} if state is None else thread)})
    return pd.DataFrame(rows)


def spikes_of(frame: pd.DataFrame) -> Finding:
    [finding] = [f for f in other_time(evidence(ledger=frame)) if f.id == "steps.spikes"]
    return finding


@pytest.mark.parametrize(("state", "words", "fix"), [
    ("blocked", "was blocked 100% of the time", WAITS),
    ("running", "was on a core 100% of the time", PERIODIC),
    ("runnable", "waited for a core 100% of the time", CORES),
])
def test_the_thread_state_of_the_extra_time_names_the_spikes_and_their_fix(
        state: str, words: str, fix: object) -> None:
    finding = spikes_of(ledger([20, 57, 90, 140], state))
    assert words in finding.title, finding.title
    assert finding.fixes[0] is fix
    parts = finding.evidence["extra_time_thread"]
    assert parts[state] == pytest.approx(1.0) and sum(parts.values()) == pytest.approx(1.0)
    assert "every_steps" not in finding.evidence  # irregular gaps: no period


def test_spikes_every_n_steps_are_said_periodic() -> None:
    finding = spikes_of(ledger(list(range(10, 200, 25)), "running"))
    assert finding.evidence["every_steps"] == 25
    assert "every 25 steps" in finding.title


def test_stack_samplings_pauses_are_not_the_jobs_blocked_time() -> None:
    # spikes on a core while the sampler paused every step: still "on a core"
    content = spike_content(ledger([20, 57, 90], "running", sampler=0.05),
                            np.isin(np.arange(200), [20, 57, 90]))
    assert content.state == "running" and content.parts is not None
    assert content.parts["blocked"] == pytest.approx(0.0, abs=1e-9)


def test_without_thread_times_the_finding_is_as_before() -> None:
    finding = spikes_of(ledger([20, 57, 90, 140], None))
    assert "training thread" not in finding.title
    assert finding.fixes == (PERIODIC,) and "extra_time_thread" not in finding.evidence


def test_a_mix_of_states_names_none() -> None:
    frame = ledger([20, 57, 90, 140], "running")
    half = frame["step"].isin([21, 58])  # two of the four blocked instead
    frame.loc[half, "running_s"] = 0.08
    frame.loc[half, "blocked_s"] = 0.02 + SPIKE_S
    content = spike_content(frame, frame["wall_s"].to_numpy() > 0.5)
    assert content.state is None and content.parts is not None
    assert content.parts["running"] == pytest.approx(0.5)


def test_a_slow_step_after_each_periodic_one_does_not_hide_the_period() -> None:
    frame = ledger(list(range(10, 200, 25)), "running")
    after = frame["step"].isin(range(12, 201, 25))  # the step after each: a little slow too
    frame.loc[after, "wall_s"] = 0.4
    finding = spikes_of(frame)
    assert finding.evidence["every_steps"] == 25 and finding.evidence["spike_steps"] == 16


def test_spikes_shorter_than_the_parents_ticks_have_no_thread_state() -> None:
    """Under two of the parent's ticks, a step's thread times are the ticks' around it, the
    ordinary steps beside it mixed in: they name nothing."""
    frame = ledger(list(range(5, 200, 10)), "blocked")
    slow = frame["wall_s"] > 0.5
    frame.loc[slow, "wall_s"] = 0.4
    finding = spikes_of(frame)
    assert "training thread" not in finding.title and finding.fixes == (PERIODIC,)
