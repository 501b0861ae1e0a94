"""A slow step that waited for another rank's slow step gets the cause ``peer`` (issue 34, item
2), naming the rank and its own cause; two ranks that both waited stay unexplained, and a
rank that ran through its extra time (a straggler) is the cause, never the one waiting
(doctor.analyse.peer_waits, doctor.rules.causes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from doctor.analyse.causes import UNEXPLAINED, Cause, Intervals, slow_steps
from doctor.analyse.gc_pauses import GC
from doctor.analyse.peer_waits import PEER, with_peer_waits
from doctor.pipeline import analyze_run
from doctor.probes.gc_pauses import GcProbe
from doctor.record.session import CLOSE, Session
from tests.support import FakeClock, write_record

STEP_S, PAUSE_S = 0.1, 0.6


def ddp_loop(run_dir: Path, steps: int = 40, gc_at: tuple[int, ...] = (15, 30)) -> None:
    """Two ranks in step, as DDP keeps them: rank 1 collects (PAUSE_S) at ``gc_at``; rank 0
    collects nothing and waits as long at the all-reduce of the same steps."""
    clocks = [FakeClock(), FakeClock()]
    sessions = [Session(run_dir, rank=r, clock=clocks[r], window_start=10**9) for r in (0, 1)]
    probe = GcProbe(sessions[1])
    sessions[1].on(CLOSE, probe._close)
    for i in range(steps):
        for rank, (session, clock) in enumerate(zip(sessions, clocks, strict=True)):
            clock.tick(STEP_S / 2)
            if i in gc_at:
                if rank == 1:
                    probe._callback("start", {"generation": 2})
                clock.tick(PAUSE_S)
                if rank == 1:
                    probe._callback("stop", {"generation": 2, "collected": 9000,
                                             "uncollectable": 0})
            clock.tick(STEP_S / 2)
            session.record_optimizer_start()
            session.record_optimizer_end(0)
    for session in sessions:
        session.close()
    write_record(run_dir, t0_monotonic_s=0.0)


def test_a_rank_that_waited_for_another_ranks_collection_says_so(tmp_path: Path) -> None:
    ddp_loop(tmp_path)
    analysis = analyze_run(tmp_path)
    slow = analysis.sections.slow_steps
    assert slow is not None
    causes = {(s.rank, s.step): s.cause for s in slow.steps}
    assert {k: v for k, v in causes.items() if k[0] == 1} == {(1, 15): GC, (1, 30): GC}
    waited = [s for s in slow.steps if s.rank == 0]
    assert [s.cause for s in waited] == [PEER, PEER]
    assert [s.words[0].split(":")[0] for s in waited] == ["rank 1, step 15", "rank 1, step 30"]
    assert all("garbage collector (generation 2" in s.words[0] for s in waited)
    findings = {f.id: f for f in analysis.verdict.findings}
    peer = findings["steps.peer"]
    assert peer.evidence["slow_steps"] == 2 and "rank 1, step 15: Python's garbage" in peer.title
    assert "gc.freeze()" in peer.fixes[0].code and "rank 1" in peer.fixes[0].title
    assert "steps.spikes" not in findings  # nothing left unexplained


def two_ranks(walls: dict[int, list[float]], running: dict[int, list[float]] | None = None
              ) -> pd.DataFrame:
    """A step table of two ranks in step: each step starts when both ended the one before."""
    n = len(walls[0])
    start = np.concatenate([[0.0], np.cumsum(np.maximum(walls[0], walls[1]))[:-1]])
    frames = []
    for rank in (0, 1):
        flags = np.zeros(n, dtype=bool)
        frames.append(pd.DataFrame({
            "rank": rank, "step": np.arange(1, n + 1), "start_s": start, "wall_s": walls[rank],
            "warmup": np.arange(n) < 3, "in_window": flags, "sampled": flags, "in_range": True,
            "analyzed": np.arange(n) >= 3,
            "running_s": (running or {}).get(rank, [np.nan] * n)}))
    return pd.concat(frames, ignore_index=True)


def test_a_straggler_is_the_cause_and_two_ranks_that_both_waited_are_not_each_others() -> None:
    n = 20
    walls = {0: [0.4] * n, 1: [0.4] * n}
    walls[0][10] = walls[1][10] = 2.0  # rank 1 computed 1.6 s more; rank 0 waited
    walls[0][15] = walls[1][15] = 2.0  # both blocked (a shared store): nobody's own work
    running = {0: [0.3] * n, 1: [0.3] * n}
    running[1][10] = 1.8
    slow = with_peer_waits(slow_steps(two_ranks(walls, running), []), two_ranks(walls, running))
    causes = {(s.rank, s.step): s.cause for s in slow.steps}
    assert causes == {(0, 11): PEER, (1, 11): UNEXPLAINED, (0, 16): UNEXPLAINED,
                      (1, 16): UNEXPLAINED}
    waited = next(s for s in slow.steps if s.cause == PEER)
    assert waited.words[0].startswith("rank 1, step 11: its own work")
    assert "Even out the work of rank 1" in slow.causes[PEER].fix.title  # type: ignore[union-attr]


def test_one_rank_or_a_cause_of_its_own_is_left_as_it_was() -> None:
    n = 20
    walls = {0: [0.4] * n, 1: [0.4] * n}
    walls[0][10] = walls[1][10] = 2.0
    table = two_ranks(walls)
    gc = Cause(GC, "garbage collection", {0: Intervals.of([4.0], [5.6]),
                                          1: Intervals.of([4.0], [5.6])})
    slow = with_peer_waits(slow_steps(table, [gc]), table)
    assert {s.cause for s in slow.steps} == {GC}  # each collected itself: no peer wait
    one = table[table["rank"] == 0]
    alone = slow_steps(one, [])
    assert with_peer_waits(alone, one) is alone


def test_ranks_of_different_nodes_are_not_compared() -> None:
    """Each node's times are from its own start: a rank on node 1 is no peer of node 0's."""
    n = 20
    walls = {0: [0.4] * n, 1: [0.4] * n}
    walls[0][10] = walls[1][10] = 2.0
    running = {0: [0.3] * n, 1: [0.3] * n}
    running[1][10] = 1.8
    table = two_ranks(walls, running)
    same = with_peer_waits(slow_steps(table, []), table, {0: 0, 1: 0})
    assert {(s.rank, s.cause) for s in same.steps} == {(0, PEER), (1, UNEXPLAINED)}
    apart = with_peer_waits(slow_steps(table, []), table, {0: 0, 1: 1})
    assert {s.cause for s in apart.steps} == {UNEXPLAINED}
