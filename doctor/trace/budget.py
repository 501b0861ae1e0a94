"""A bound on the events a trace keeps, so that memory does not grow with the trace.

A trace of a few steps of a large model holds tens of millions of events; the analysis keeps
tens of bytes of each. Past :data:`MAX_EVENTS` events the trace keeps its first steps whole (every
event that starts before a step's end, whatever order the file writes them in: Kineto writes the
host's events before the GPU's) and leaves the later ones out, saying how many of how many steps
it analysed. The cut is at the end of the latest step that fits in three quarters of the budget,
so that the events still to come of the kept steps fit in the rest; it keeps the first step
whole even when that one step alone is more than the budget. Before any step is known nothing
is left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from doctor.trace.collect import BlockCollector

#: Events kept of one trace (about 45 bytes each in the timeline's columns).
MAX_EVENTS = 4_000_000
#: The share of the budget the steps kept fill when the cut is made.
FILL = 0.75
#: Blocks' pieces of a kind joined into one as they come (see EventBudget._merge).
MERGE_PIECES = 64
Part = tuple[np.ndarray, np.ndarray, list[np.ndarray]]


@dataclass(frozen=True)
class TraceCut:
    """What a trace left out: its steps after ``kept_steps`` of ``steps``."""

    kept_steps: int
    steps: int
    kept_events: int
    left_out_events: int
    limit: int

    def note(self) -> str:
        return (f"The trace has more than {self.limit:,} events: its first {self.kept_steps} "
                f"of {self.steps} steps are analysed ({self.kept_events:,} events; "
                f"{self.left_out_events:,} of later steps left out, so that memory stays "
                "bounded).")


class EventBudget:
    """Applied to a collector after each block (:meth:`apply`): drops what starts after the
    cut from the columns collected so far and from each new block, and joins the blocks'
    pieces of each kind every MERGE_PIECES blocks."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = MAX_EVENTS if limit is None else limit
        self.cutoff = math.inf
        self.kept = 0
        self.left_out = 0
        self._filtered: dict[str, int] = {}
        self._merged: dict[str, int] = {}
        self._steps: set[int] = set()

    def apply(self, col: BlockCollector) -> None:
        self._steps |= col.steps.keys()
        for kind, parts in col.chunks.items():
            for k in range(self._filtered.get(kind, 0), len(parts)):
                parts[k] = self._cut(parts[k])
                self.kept += len(parts[k][0])
            self._filtered[kind] = len(parts)
        if self.kept > self.limit and col.steps:
            self._lower(col)
        for kind, parts in col.chunks.items():
            if len(parts) - self._merged.get(kind, 0) >= MERGE_PIECES:
                self._merge(kind, parts)

    def _merge(self, kind: str, parts: list[Part]) -> None:
        """Join the pieces of ``kind`` since the last join into one: thousands of small arrays,
        freed and kept in turn, leave the heap in pieces that are never handed back."""
        first = self._merged.get(kind, 0)
        new = parts[first:]
        joined = (np.concatenate([p[0] for p in new]), np.concatenate([p[1] for p in new]),
                  [np.concatenate([p[2][n] for p in new]) for n in range(len(new[0][2]))])
        parts[first:] = [joined]
        self._merged[kind] = self._filtered[kind] = len(parts)

    def _cut(self, part: Part) -> Part:
        start, end, columns = part
        if self.cutoff == math.inf:
            return part
        keep = start < self.cutoff
        if keep.all():
            return part
        self.left_out += int(len(keep) - keep.sum())
        return start[keep], end[keep], [c[keep] for c in columns]

    def _lower(self, col: BlockCollector) -> None:
        starts = np.sort(np.concatenate([p[0] for parts in col.chunks.values() for p in parts]))
        ends = np.array(sorted(e for _, e in col.steps.values()))
        fits = np.searchsorted(starts, ends, side="left") <= FILL * self.limit
        cutoff = float(ends[fits][-1]) if fits.any() else float(ends[0])
        if cutoff >= self.cutoff:
            return
        self.cutoff = cutoff
        self.kept = 0
        for parts in col.chunks.values():
            for k, part in enumerate(parts):
                parts[k] = self._cut(part)
                self.kept += len(parts[k][0])

    def finish(self, col: BlockCollector) -> TraceCut | None:
        """Leave out the steps the cut does not hold whole; what was left out, or None."""
        if self.cutoff == math.inf:
            return None
        col.steps = {n: (s, e) for n, (s, e) in col.steps.items() if e <= self.cutoff}
        ends = [p[1] for parts in col.chunks.values() for p in parts if len(p[1])]
        col.last = float(max(e.max() for e in ends)) if ends else col.last
        return TraceCut(kept_steps=len(col.steps), steps=len(self._steps), kept_events=self.kept,
                        left_out_events=self.left_out, limit=self.limit)
