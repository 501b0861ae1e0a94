"""A slow step that waited for another rank: the other rank's slow step, and its cause.

In a job whose ranks meet at every step (DDP's all-reduce, FSDP's gathers, a pipeline's
sends), one rank's slow step holds the others at the next meeting: rank 1's 0.7 s garbage
collection makes rank 0's step 0.7 s longer too, though rank 0 collected nothing. Rank 0's
step has no cause of its own; it waited for a peer. The cause ``peer`` is found after the
others (doctor.analyse.causes): its intervals on rank r are the other ranks' slow steps that
were slow of their own accord, each weighted by its time over its median (the part of the
overlap that is the peer's delay, as machine_load weighs the cores others took):

- a slow step with a cause of its own (a GC pause, a checkpoint, a compilation, ...);
- or an unexplained one whose extra time its training thread spent running (its own work: a
  straggler), measured by the parent's schedstat samples where the step spans OWN_TICKS of
  them (a shorter step gets its neighbours' mean, doctor.analyse.spike_content).

Only rank r's slow steps that stayed unexplained are looked at again, and not those whose own
thread ran through their extra time (a straggler is not waiting for anyone): two ranks that
both waited (a slow network, a shared store) stay unexplained, never each other's cause. The
words name the peer and its cause ("rank 1, step 15: Python's garbage collector (generation 2
collection, 600 ms, ...)"); the fix is
the peer's cause's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np
import pandas as pd

from doctor.analyse.causes import (
    UNEXPLAINED,
    Cause,
    Intervals,
    SlowStep,
    SlowSteps,
    attributed,
    regrouped,
)
from doctor.analyse.spike_content import OWN_TICKS
from doctor.analyse.whole_run import LOST
from doctor.store.samples import SAMPLE_INTERVAL_S
from doctor.verdict import Fix

PEER = "peer"
RUNNING = 0.5  # an unexplained slow step whose thread ran this much of its extra time: its own


def stragglers(table: pd.DataFrame, steps: Sequence[SlowStep]) -> set[tuple[int, int]]:
    """(rank, step) of each slow step whose training thread spent RUNNING or more of its time
    over the median running (over its rank's analysed steps' median running time), measured
    where it spans OWN_TICKS of the parent's ticks."""
    if "running_s" not in table or table.empty:
        return set()
    steady = table[table["analyzed"].astype(bool)] if "analyzed" in table else table
    medians = steady.groupby("rank")["running_s"].median()
    running = {(int(r), int(n)): (float(ran), float(medians.get(r, np.nan)))
               for r, n, ran in zip(table["rank"], table["step"], table["running_s"],
                                    strict=True)}
    out = set()
    for s in steps:
        ran, usual = running.get((s.rank, s.step), (float("nan"), float("nan")))
        if s.seconds < OWN_TICKS * SAMPLE_INTERVAL_S or ran != ran or usual != usual:
            continue
        if ran - usual >= RUNNING * s.over_s > 0:
            out.add((s.rank, s.step))
    return out


def peer_cause(slow: SlowSteps, table: pd.DataFrame, own: set[tuple[int, int]],
               nodes: Mapping[int, int] | None = None) -> Cause | None:
    """The ``peer`` cause of a run of two or more ranks: on each rank, the other ranks' slow
    steps that were slow of their own accord (a cause of their own, or in ``own``: the
    stragglers); None where there are none. ``nodes``: each rank's node, where the run has
    several: only ranks of one node are compared (each node's times are from its own start,
    on its own clock)."""
    ranks = sorted({int(r) for r in table["rank"]}) if "rank" in table else []
    node = dict(nodes or {})
    if len(ranks) < 2:
        return None
    sources = _sources(slow.steps, own)
    if not sources:
        return None
    intervals = {}
    for rank in ranks:
        theirs = [s for s in sources if s.rank != rank
                  and node.get(s.rank, 0) == node.get(rank, 0)]
        if theirs:
            intervals[rank] = Intervals.of(
                [s.start_s for s in theirs], [s.start_s + s.seconds for s in theirs],
                [s.over_s / s.seconds for s in theirs], [_words(s, slow) for s in theirs])
    if not intervals:
        return None
    main = _main_cause(sources)
    return Cause(PEER, "a wait for another rank", intervals, fix=_fix(main, sources, slow),
                 follows=main)


def _sources(steps: Sequence[SlowStep], own: set[tuple[int, int]]) -> list[SlowStep]:
    """The slow steps that were slow of their own accord (a cause, or a straggler's)."""
    return [s for s in steps if s.where != LOST and s.seconds > 0 and s.over_s > 0
            and s.cause != PEER and (s.cause != UNEXPLAINED or (s.rank, s.step) in own)]


def with_peer_waits(slow: SlowSteps, table: pd.DataFrame,
                    nodes: Mapping[int, int] | None = None) -> SlowSteps:
    """``slow`` with each unexplained slow step that waited for another rank's slow step (of
    its node) given the cause ``peer``, and the groups made again."""
    own = stragglers(table, slow.steps)
    peer = peer_cause(slow, table, own, nodes)
    if peer is None:
        return slow
    causes = [*slow.causes.values(), peer]
    steps = [attributed(s.rank, s.step, s.start_s, s.seconds, s.median_s, s.where, s.stall,
                        causes)
             if s.cause == UNEXPLAINED and s.where != LOST and (s.rank, s.step) not in own
             else s for s in slow.steps]
    return regrouped(replace(slow, causes={c.name: c for c in causes}), steps)


def _words(step: SlowStep, slow: SlowSteps) -> str:
    if step.cause == UNEXPLAINED:
        return (f"rank {step.rank}, step {step.step}: its own work, "
                f"{step.over_s:.2f} s over its median on a core")
    return f"rank {step.rank}, step {step.step}: {slow.cause_words(step)}"


def _main_cause(sources: Sequence[SlowStep]) -> str:
    """The cause that made most of the waited-for steps' extra time (UNEXPLAINED: their own
    work)."""
    by_cause: dict[str, float] = {}
    for s in sources:
        by_cause[s.cause] = by_cause.get(s.cause, 0.0) + s.over_s
    return max(by_cause, key=lambda k: by_cause[k])


def _fix(main: str, sources: Sequence[SlowStep], slow: SlowSteps) -> Fix:
    """Fix what the waited-for ranks did: ``main``, the cause of most of their extra time."""
    ranks = sorted({s.rank for s in sources if s.cause == main})
    who = "rank " + ", ".join(str(r) for r in ranks) if len(ranks) < 5 else f"{len(ranks)} ranks"
    if main == UNEXPLAINED:
        return Fix(
            title=f"Even out the work of {who}",
            why=f"{who} ran longer at these steps (its training thread on a core, not waiting) "
                "and every other rank waited at the next collective: a larger batch or "
                "sequence on that rank, an imbalanced shard, or work only it does (logging, "
                "metrics on rank 0). Spread it, or move it off the step.")
    cause = slow.causes.get(main)
    label = cause.label if cause is not None else main
    fix = cause.fix if cause is not None else None
    return Fix(
        title=f"Fix {label} on {who}: the other ranks wait for it",
        why=f"each slow step of {who} ({label}) held every other rank at the next collective; "
            "the finding for that cause has the fix" + (f" ({fix.title})" if fix else "")
            + ", and it removes these waits too",
        code=fix.code if fix is not None else "")


__all__ = ["PEER", "peer_cause", "stragglers", "with_peer_waits"]
