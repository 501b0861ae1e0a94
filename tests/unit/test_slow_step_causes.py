"""Each slow step gets its cause (issue 34, item 2): the garbage collector's pauses and other
processes on the cores, from recorded loops and hand-built frames (doctor.analyse.causes,
gc_pauses, machine_load; doctor.rules.causes), and a slow step that nothing overlapped stays
unexplained, with the generic finding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from doctor.analyse.analysis import Sections
from doctor.analyse.causes import UNEXPLAINED, Cause, Intervals, slow_steps
from doctor.analyse.evidence import Evidence
from doctor.analyse.gc_pauses import GC, GcSummary
from doctor.analyse.machine_load import MACHINE, other_load
from doctor.pipeline import analyze_run
from doctor.probes.gc_pauses import GcProbe
from doctor.record.session import CLOSE, Session
from doctor.reports.html import render_html
from doctor.reports.json import verdict_data
from doctor.reports.slow_steps import slow_step_lines
from doctor.reports.text import render_text
from doctor.rules.causes import GC_FREEZE, slow_step_causes
from doctor.rules.other import other_time
from tests.support import FakeClock, write_record

STEP_S, PAUSE_S, STALL_S = 0.1, 0.5, 1.0


def gc_loop(run_dir: Path, steps: int = 40, gc_at: tuple[int, ...] = (15, 30),
            slow_at: tuple[int, ...] = (22,)) -> None:
    """Optimizer steps of STEP_S; in the steps ``gc_at`` a full collection of PAUSE_S, in the
    steps ``slow_at`` STALL_S more of something no cause saw."""
    clock = FakeClock()
    session = Session(run_dir, rank=0, clock=clock, window_start=10**9)
    probe = GcProbe(session)
    session.on(CLOSE, probe._close)
    for i in range(steps):
        clock.tick(STEP_S / 2)
        if i in gc_at:
            probe._callback("start", {"generation": 2})
            clock.tick(PAUSE_S)
            probe._callback("stop", {"generation": 2, "collected": 5000, "uncollectable": 0})
        if i in slow_at:
            clock.tick(STALL_S)
        for _ in range(30):  # young collections: counted, never written
            probe._callback("start", {"generation": 0})
            probe._callback("stop", {"generation": 0, "collected": 1, "uncollectable": 0})
        clock.tick(STEP_S / 2)
        session.record_optimizer_start()
        session.record_optimizer_end(0)
    session.close()
    write_record(run_dir, t0_monotonic_s=0.0)


def test_the_gc_steps_get_the_gc_cause_and_the_freeze_fix(tmp_path: Path) -> None:
    gc_loop(tmp_path)
    analysis = analyze_run(tmp_path)
    slow = analysis.sections.slow_steps
    assert slow is not None
    assert {s.step: s.cause for s in slow.steps} == {15: GC, 30: GC, 22: UNEXPLAINED}
    assert all("generation 2" in s.words[0] for s in slow.steps if s.cause == GC)
    group = slow.group(GC)
    assert group is not None and group.count == 2
    assert group.over_s == pytest.approx(2 * PAUSE_S, rel=1e-6)
    steps_s = 39 * STEP_S + 2 * PAUSE_S + STALL_S  # the run's whole: every step's time
    assert group.share == pytest.approx(2 * PAUSE_S / steps_s, rel=1e-6)
    findings = {f.id: f for f in analysis.verdict.findings}
    gc = findings["steps.gc"]
    assert gc.fixes[0].title == GC_FREEZE.title and "gc.freeze()" in gc.fixes[0].code
    # without the pauses, the steps after warm-up run in their time less the pauses
    after = steps_s - 3 * STEP_S
    assert gc.estimated_speedup == pytest.approx(after / (after - 2 * PAUSE_S), rel=1e-6)
    assert gc.evidence["steps"] == [15, 30]
    # the unexplained one keeps the generic finding, without the GC steps
    spikes = findings["steps.spikes"]
    assert spikes.evidence["spike_steps"] == 1 and spikes.evidence["explained_steps"] == 2
    assert "no known cause" in spikes.title
    summary = analysis.sections.gc[0]
    assert (summary.collections, summary.full, summary.written_full) == (40 * 30 + 2, 2, 2)
    data = verdict_data(analysis)
    assert {g["cause"] for g in data["slow_steps"]["groups"]} == {GC, UNEXPLAINED}
    assert data["gc"][0]["full"] == 2
    text = render_text(analysis)
    assert "slow steps, Python's garbage collector: 2 (steps 15, 30)" in text


def test_without_a_gc_ring_the_spikes_stay_periodic_work(tmp_path: Path) -> None:
    """A run without the probe's records (an older doctor): no cause, the finding as before."""
    gc_loop(tmp_path, gc_at=(), slow_at=(15, 22, 30))
    analysis = analyze_run(tmp_path)
    findings = {f.id: f for f in analysis.verdict.findings}
    assert "steps.gc" not in findings
    spikes = findings["steps.spikes"]
    assert spikes.title.startswith("3 slow steps (over 3x the median)")
    assert "explained_steps" not in spikes.evidence
    assert spikes.fixes[0].title == "Make periodic work rarer or asynchronous"


def table(walls: list[float]) -> pd.DataFrame:
    """A step table of one rank: consecutive steps of these times, the first 3 warm-up."""
    n = len(walls)
    start = np.concatenate([[0.0], np.cumsum(walls)[:-1]])
    flags = np.zeros(n, dtype=bool)
    return pd.DataFrame({"rank": 0, "step": np.arange(1, n + 1), "start_s": start,
                         "wall_s": walls, "warmup": np.arange(n) < 3, "in_window": flags,
                         "sampled": flags, "in_range": True, "analyzed": np.arange(n) >= 3})


def test_a_cause_counts_only_where_it_took_enough_of_the_step() -> None:
    walls = [0.1] * 20
    walls[10] = walls[15] = 0.5  # two slow steps: [1.0, 1.5) and [1.9, 2.4)
    cause = Cause("checkpoint", "a checkpoint", {0: Intervals.of([1.0, 1.9], [1.35, 1.95])})
    slow = slow_steps(table(walls), [cause])
    by_step = {s.step: s for s in slow.steps}
    assert by_step[11].cause == "checkpoint" and by_step[11].lost["checkpoint"] == \
        pytest.approx(0.35)
    assert by_step[16].cause == UNEXPLAINED  # 0.05 s of its 0.4 s over the median
    assert [g.cause for g in slow.groups] == ["checkpoint", UNEXPLAINED]


def test_other_processes_are_weighted_by_the_cores_they_took() -> None:
    system = pd.DataFrame({"node": 0, "t_s": [0.0, 0.5, 1.0, 1.5, 2.0],
                           "cores": 2.0, "busy_cores": [1.0, 1.0, 2.0, 2.0, 1.0]})
    host = pd.DataFrame({"node": 0, "pid": 7, "t_s": [0.0, 0.5, 1.0, 1.5, 2.0],
                         "cpu_pct": [np.nan, 100.0, 100.0, 100.0, 100.0]})
    load = other_load(host, system)
    assert load is not None
    assert list(load.start_s) == [0.5, 1.0] and list(load.end_s) == [1.0, 1.5]
    assert list(load.weight) == [0.5, 0.5]
    assert "1.0 of 2 cores" in load.words[0]
    walls = [0.1] * 10 + [0.4] + [0.1] * 10  # the slow step: [1.0, 1.4), while they ran
    machine = Cause(MACHINE, "other processes", {0: load}, machine=True)
    slow = slow_steps(table(walls), [machine])
    [step] = slow.steps
    assert step.cause == MACHINE and step.lost[MACHINE] == pytest.approx(0.2)
    assert slow.groups[0].machine
    # where the training thread never waited for a core, they took nothing from it
    waited = pd.Series([np.nan, 0.0, 0.0, 0.0, 0.0], index=system["t_s"])
    assert other_load(host, system, waited=waited) is None


def test_the_jobs_own_workers_starting_or_ending_are_not_other_processes() -> None:
    """A DataLoader's workers start at an epoch: their first tick has no CPU in the samples, and
    what the machine burnt beyond them is theirs; likewise the tick in which they ended."""
    t = [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    system = pd.DataFrame({"node": 0, "t_s": t, "cores": 2.0,
                           "busy_cores": [1.0, 1.0, 2.0, 2.0, 1.0, 2.0, 1.0]})
    main = pd.DataFrame({"node": 0, "pid": 7, "t_s": t, "cpu_pct": [np.nan] + [100.0] * 6})
    worker = pd.DataFrame({"node": 0, "pid": 8, "t_s": [1.0, 1.5, 2.0],
                           "cpu_pct": [np.nan, 100.0, 0.0]})
    load = other_load(pd.concat([main, worker]), system)
    assert load is None  # 1.0: the worker started; 1.5: its CPU is sampled; 2.5: it had ended
    outside = system.assign(busy_cores=[1.0, 1.0, 2.0, 2.0, 1.0, 2.0, 2.0])
    load = other_load(pd.concat([main, worker]), outside)
    assert load is not None and list(load.end_s) == [3.0]  # a tick the job's set did not change


def test_steps_slowed_by_other_processes_are_the_machines_not_periodic_work() -> None:
    walls = [0.1] * 30
    for i in (10, 20):
        walls[i] = 0.5
    steps = table(walls)
    busy = Intervals.of(steps["start_s"][[10, 20]], steps["start_s"][[10, 20]] + 0.5,
                        [1.0, 1.0], ["other processes kept 2.0 of 2 cores busy: make"] * 2)
    slow = slow_steps(steps, [Cause(MACHINE, "other processes", {0: busy}, machine=True)])
    ledger = steps[steps["analyzed"]].assign(other=0.0)
    before = other_time(Evidence(ledger=ledger))
    assert [f.id for f in before] == ["steps.spikes"]  # without causes: periodic work
    after = Evidence(ledger=ledger, slow_steps=slow)
    assert [f.id for f in other_time(after)] == []
    [machine] = slow_step_causes(after)
    assert machine.id == "steps.machine" and "the machine, not the job" in machine.title
    assert machine.evidence["steps"] == [11, 21] and "make" in machine.evidence["what"][0]


def test_the_report_has_a_line_per_cause(tmp_path: Path) -> None:
    gc_loop(tmp_path)
    html = render_html(analyze_run(tmp_path))
    assert "Slow steps and their causes" in html
    assert "garbage collector, rank 0: 1202 collections (2 full)" in html


def test_a_long_stall_says_its_cause(tmp_path: Path) -> None:
    """A full collection of 2 s in one step: the stall finding (always shown) names it."""
    clock = FakeClock()
    session = Session(tmp_path, rank=0, clock=clock, window_start=10**9)
    probe = GcProbe(session)
    for i in range(40):
        clock.tick(STEP_S)
        if i == 20:
            probe._callback("start", {"generation": 2})
            clock.tick(2.0)
            probe._callback("stop", {"generation": 2, "collected": 7, "uncollectable": 0})
        session.record_optimizer_start()
        session.record_optimizer_end(0)
    session.close()
    write_record(tmp_path, t0_monotonic_s=0.0)
    [stall] = [f for f in analyze_run(tmp_path).verdict.findings if f.id == "steps.stall"]
    assert stall.evidence["step"] == 20 and stall.evidence["cause"] == GC
    assert "overlapped Python's garbage collector (generation 2 collection, 2000 ms" in \
        stall.title


def test_a_collector_that_paused_next_to_nothing_goes_unsaid() -> None:
    def summary(share: float) -> GcSummary:
        return GcSummary(0, 100, 1, 0.01, 1, 1, 0.005, 0.005, 10.0, share)

    assert slow_step_lines(Sections(gc={0: summary(0.001)})) == []
    [line] = slow_step_lines(Sections(gc={0: summary(0.05)}))
    assert line.startswith("garbage collector, rank 0: 100 collections (1 full)")
