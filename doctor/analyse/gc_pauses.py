"""The garbage collector's pauses in each training process, as a cause of slow steps.

From the GC probe (doctor.probes.gc_pauses): the ``gc`` ring's collections (every full one,
generation 2, and any other of 1 ms or more), each an interval on the process's clock with its
generation and the objects it collected; and from meta.json, as the process closed, every
collection counted with the total pause. ``gc_cause`` makes the written collections a Cause
(doctor.analyse.causes) on the ledger's clock; ``gc_summaries`` says per rank how many
collections ran and what they paused the process for, over the run and in its steps. A run
recorded before the probe existed has none of it: no cause, no summary.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from doctor.analyse.causes import Cause, Intervals
from doctor.analyse.steps import NS, WINDOW, RankSteps
from doctor.store.records import GC_GENERATION_BITS
from doctor.store.rundata import RunData
from doctor.trace.intervals import overlap_per_span

GC = "gc"
FULL = 2  # the generation of a full collection
GC_GENERATION_MASK = (1 << GC_GENERATION_BITS) - 1


@dataclass(frozen=True)
class GcSummary:
    """One rank's collections: as counted over the process's life (None where it did not say:
    a process killed before it closed), the written ones, and their pause within its steps."""

    rank: int
    collections: int | None  # every collection, all generations
    full: int | None  # generation 2
    pause_s: float | None  # every collection's pause
    written: int  # collections in the ring (full ones and long young ones)
    written_full: int
    longest_s: float  # the longest pause (a process that did not close: the longest written)
    in_steps_s: float  # the written pauses within the steps after warm-up
    steps_s: float  # the time of those steps
    share: float  # pause_s (else the written pauses) of the run's duration

    @property
    def speedup(self) -> float:
        """The steps' speed without the written pauses in them (what gc.freeze aims at)."""
        rest = self.steps_s - self.in_steps_s
        return self.steps_s / rest if rest > 0 and self.steps_s > 0 else 1.0

    def to_dict(self) -> dict[str, object]:
        return {"rank": self.rank, "collections": self.collections, "full": self.full,
                "pause_s": None if self.pause_s is None else round(self.pause_s, 4),
                "written": self.written, "written_full": self.written_full,
                "longest_s": round(self.longest_s, 4),
                "in_steps_s": round(self.in_steps_s, 4), "steps_s": round(self.steps_s, 4),
                "share_of_run": round(self.share, 4), "speedup": round(self.speedup, 3)}


def _collections(run: RunData, r: RankSteps) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                       np.ndarray]:
    """(start_s, end_s, generation, collected) of the rank's written collections, on the
    ledger's clock; empty for a trace's own steps (no process clock)."""
    t0, t1, key = run.intervals_of(r.process, GC)
    if r.kind == WINDOW or not len(t0):
        empty = np.zeros(0)
        return empty, empty, empty.astype(np.int64), empty.astype(np.int64)
    origin = run.record.t0_ns.get(r.node, 0)
    return ((t0 - origin) * NS, (t1 - origin) * NS, key & GC_GENERATION_MASK,
            key >> GC_GENERATION_BITS)


def gc_cause(run: RunData, ranks: dict[int, RankSteps]) -> Cause | None:
    """The written collections of each rank's training process as a Cause (None: none)."""
    intervals = {}
    for rank, r in ranks.items():
        start, end, generation, collected = _collections(run, r)
        if len(start):
            words = [f"generation {int(g)} collection, {(e - s) * 1e3:.0f} ms, {int(c):,} "
                     "objects freed"
                     for s, e, g, c in zip(start, end, generation, collected, strict=True)]
            intervals[rank] = Intervals.of(start, end, words=words)
    if not intervals:
        return None
    return Cause(GC, "Python's garbage collector", intervals)


def gc_summaries(run: RunData, ranks: dict[int, RankSteps], table: pd.DataFrame,
                 run_s: float | None) -> dict[int, GcSummary]:
    """Per rank whose training process ran the GC probe: its collections and their pauses."""
    out = {}
    for rank, r in ranks.items():
        proc = run.rows("processes", r.process)
        counted = proc.iloc[0] if not proc.empty and "gc_pause_s" in proc else None
        start, end, generation, _ = _collections(run, r)
        if (counted is None or pd.isna(counted["gc_pause_s"])) and not len(start):
            continue
        rows = table[(table["rank"] == rank) & table["in_range"] & ~table["warmup"]]
        s = rows["start_s"].to_numpy(np.float64)
        e = s + rows["wall_s"].to_numpy(np.float64)
        order = np.argsort(start, kind="stable")
        within = float(overlap_per_span(start[order], end[order], s, e).sum()) if len(s) else 0.0
        steps_s = float(rows["wall_s"].sum())
        pause = None if counted is None or pd.isna(counted["gc_pause_s"]) \
            else float(counted["gc_pause_s"])
        whole = run_s if run_s and run_s > 0 else float(table.loc[table["rank"] == rank,
                                                                  "wall_s"].sum())
        paused = pause if pause is not None else float((end - start).sum())
        written_longest = float((end - start).max()) if len(start) else 0.0
        counted_longest = None if counted is None or "gc_longest_s" not in counted \
            or pd.isna(counted["gc_longest_s"]) else float(counted["gc_longest_s"])
        out[rank] = GcSummary(
            rank=rank, collections=_count(counted, "gc_collections"),
            full=_count(counted, "gc_full"), pause_s=pause, written=len(start),
            written_full=int((generation >= FULL).sum()),
            longest_s=max(written_longest, counted_longest or 0.0),
            in_steps_s=within, steps_s=steps_s,
            share=paused / whole if whole > 0 else 0.0)
    return out


def _count(row: pd.Series | None, column: str) -> int | None:
    if row is None or pd.isna(row[column]):
        return None
    return int(row[column])


__all__ = ["GC", "GcSummary", "gc_cause", "gc_summaries"]
