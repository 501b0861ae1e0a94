"""Per-tick sample tables of the parent's samplers (host, GPU), bounded whatever the run's length.

A table holds flat columns of floats (``array("d")``: 8 bytes a value, no object per sample),
one row per process or GPU per tick, the rows of a tick sharing its time ``t_s``. Past
``max_rows`` rows the table thins itself: every other tick goes, whole (a tick never loses some
of its processes or GPUs), and the ticks of the run's first ``head_s`` seconds stay at the full
rate (the warm-up and the deep window's stack sampling, whose steps the parent's per-tick
thread times split: doctor.analyse.thread_time), up to half the rows. Each thinning halves what
came before it and the ticks after it come at the full rate again, so the older a tick the more
it was thinned: a 24-hour run keeps its first minutes and its newest hour at 2 Hz, its oldest
hours at a tick every minute or two; memory and ``host.npz``/``gpu.npz`` stay under
``max_rows`` rows (and one tick's) a table.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

#: Seconds from the run's start kept at the full rate (warm-up, the first deep window).
HEAD_S = 600.0


class TickTable:
    """Columns of one kind of sample, thinned by whole ticks past ``max_rows`` rows."""

    def __init__(self, columns: Sequence[str], max_rows: int, head_s: float = HEAD_S) -> None:
        if columns[0] != "t_s":
            raise ValueError("a tick table's first column is its time, t_s")
        self.names = tuple(columns)
        self.max_rows = max(2, max_rows)
        self.head_s = head_s
        self.columns: dict[str, array] = {c: array("d") for c in self.names}
        self.thinned = 0  # how many times the table was thinned

    def __len__(self) -> int:
        return len(self.columns["t_s"])

    def add(self, row: Sequence[float]) -> None:
        """One row (the columns' values in order, its time first). A full table is thinned as
        a new tick begins, never inside one: at most ``max_rows`` and one tick's rows."""
        times = self.columns["t_s"]
        if len(times) >= self.max_rows and times[-1] != row[0]:
            self.thin()
        for c, v in zip(self.names, row, strict=True):
            self.columns[c].append(float(v))

    def thin(self) -> None:
        """Drop every other tick after the head (whole ticks; the head at most half the rows)."""
        times = self.columns["t_s"]
        head = 0
        while head < len(times) and times[head] < self.head_s and head < self.max_rows // 2:
            head += 1
        keep = _every_other_tick(times, head)
        self.columns = {c: array("d", (v[i] for i in keep)) for c, v in self.columns.items()}
        self.thinned += 1


def _every_other_tick(times: array, head: int) -> list[int]:
    """The rows to keep: the first ``head``, then those of every other tick (a tick's rows
    follow one another, so a new tick starts where the time changes)."""
    keep = list(range(head))
    tick, last = -1, None
    for i in range(head, len(times)):
        if times[i] != last:
            tick, last = tick + 1, times[i]
        if tick % 2 == 0:
            keep.append(i)
    return keep
