"""Long stalls: a step many times the median (a 60 s hang, a checkpoint written inline, an
evaluation pass) is named, with its time and its share of the run, wherever it falls.

The shares leave out the steps of the profiler window (doctor.analyse.step_table), so a stall there
would vanish from the verdict without this: it is found over every step of the range but the
warm-up (compilation and lazy imports are slow by nature, and said as
warm-up). A step of the window's close also holds doctor's own trace export: that time is taken
off before the step is compared, so doctor's cost is never reported as the job's stall.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from doctor.analyse.steps import NS, WINDOW, RankSteps
from doctor.trace.intervals import overlap_per_span
from doctor.verdict import Finding

STALL_FACTOR = 10.0  # a step at least this many times the median step...
MIN_STALL_S = 1.0  # ...and at least this long
MAX_FINDINGS = 3  # the longest stalls each get a finding; the rest are counted in a note
MAJOR_SHARE = 0.20  # a stall of this share of the run or more leads the findings

IN_WINDOW, SAMPLING, ANALYSED, LEFT_OUT = ("the profiler window", "stack sampling",
                                           "the analysed steps", "the steps left out")


@dataclass(frozen=True)
class Stall:
    """One long step of one rank: its time (doctor's own export taken off), the median step it
    is compared to, its share of the run, and which steps it fell among."""

    rank: int
    step: int
    seconds: float
    median_s: float
    share: float  # of the run's duration (of the rank's steps' time where that is unknown)
    where: str  # IN_WINDOW, SAMPLING, ANALYSED or LEFT_OUT

    @property
    def times_median(self) -> float:
        return self.seconds / self.median_s if self.median_s > 0 else float("inf")

    def to_dict(self) -> dict[str, float | int | str]:
        return {"rank": self.rank, "step": self.step, "seconds": round(self.seconds, 3),
                "median_s": round(self.median_s, 4), "times_median": round(self.times_median, 1),
                "share_of_run": round(self.share, 3), "where": self.where}


def export_seconds(ranks: Mapping[int, RankSteps]) -> dict[int, np.ndarray]:
    """Per rank, the seconds of each step spent in doctor's export of the profiler window."""
    out = {}
    for rank, r in ranks.items():
        if r.window_ns is None or r.kind == WINDOW or not len(r.ends_ns):
            continue
        _start, stop_begin, stop_end = r.window_ns
        out[rank] = overlap_per_span(np.array([stop_begin], dtype=np.float64),
                                     np.array([stop_end], dtype=np.float64),
                                     r.starts_ns.astype(np.float64),
                                     r.ends_ns.astype(np.float64)) * NS
    return out


def rank_walls(table: pd.DataFrame, exports: Mapping[int, np.ndarray] | None = None
               ) -> Iterator[tuple[int, pd.DataFrame, np.ndarray]]:
    """Per rank, its steps in the range (rows of the step table, renumbered from 0) and their
    wall times less doctor's own trace export in them (``exports``: export_seconds)."""
    inside = table[table["in_range"]]
    for rank in np.unique(inside["rank"].to_numpy(np.int64)).tolist():
        rows = inside[inside["rank"] == rank].reset_index(drop=True)
        wall = rows["wall_s"].to_numpy(np.float64).copy()
        own = (exports or {}).get(rank)
        if own is not None and len(own) == len(table[table["rank"] == rank]):
            steps = table.loc[table["rank"] == rank, "step"].to_numpy(np.int64)
            order = np.argsort(steps, kind="stable")
            wanted = rows["step"].to_numpy(np.int64)
            at = np.clip(np.searchsorted(steps[order], wanted), 0, max(len(steps) - 1, 0))
            found = len(steps) > 0
            hit = steps[order][at] == wanted if found else np.zeros(len(wanted), dtype=bool)
            wall -= np.where(hit, own[order][at], 0.0) if found else 0.0
        yield rank, rows, wall


def find_stalls(table: pd.DataFrame, exports: Mapping[int, np.ndarray] | None = None,
                run_s: float | None = None) -> list[Stall]:
    """The steps of the step table (doctor.analyse.step_table) at least STALL_FACTOR
    times their rank's median step and MIN_STALL_S long, the longest first. The median is of
    the analysed steps (of every step after warm-up where none is analysed)."""
    stalls = []
    for rank, rows, wall in rank_walls(table, exports):
        steady = rows["analyzed"].to_numpy(bool)
        if not steady.any():
            steady = ~rows["warmup"].to_numpy(bool)
        if not steady.any():
            continue
        median = float(np.median(wall[steady]))
        total = float(rows["wall_s"].sum())
        whole = run_s if run_s and run_s > 0 else total
        long = (wall >= STALL_FACTOR * median) & (wall >= MIN_STALL_S) & \
            ~rows["warmup"].to_numpy(bool)
        for i in np.flatnonzero(long):
            stalls.append(Stall(rank, int(rows["step"].iloc[i]), float(wall[i]), median,
                                min(1.0, float(wall[i]) / whole) if whole > 0 else 0.0,
                                _where(rows.iloc[i])))
    return sorted(stalls, key=lambda s: -s.seconds)


def _where(row: pd.Series) -> str:
    if bool(row["in_window"]):
        return IN_WINDOW
    if bool(row["analyzed"]):
        return ANALYSED
    if bool(row["sampled"]):
        return SAMPLING
    return LEFT_OUT


def stall_findings(stalls: list[Stall]) -> list[Finding]:
    """One finding per long step (the longest MAX_FINDINGS steps; ranks that stalled in the
    same step are one stall, named by the longest)."""
    steps: dict[int, Stall] = {}
    for s in stalls:  # the longest first: the first seen of each step is its longest
        steps.setdefault(s.step, s)
    out = []
    for s in list(steps.values())[:MAX_FINDINGS]:
        ranks = sorted({o.rank for o in stalls if o.step == s.step})
        who = f"rank {s.rank}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
        out.append(Finding(
            id="steps.stall", category="other",
            severity="warning" if s.share >= MAJOR_SHARE else "info",
            title=f"Step {s.step} ({who}) took {s.seconds:.1f} s, {s.times_median:.0f}x the "
                  f"median step ({s.median_s * 1e3:.0f} ms): {s.share:.0%} of the run",
            evidence={**s.to_dict(), "ranks": ranks}))
    return out


def stall_notes(stalls: list[Stall]) -> list[str]:
    """Where each named stall fell, and what that means for the shares; how many more."""
    notes = []
    named: dict[int, Stall] = {}
    for s in stalls:
        named.setdefault(s.step, s)
    for s in sorted(list(named.values())[:MAX_FINDINGS], key=lambda s: s.step):
        if s.where == ANALYSED:
            counted = ("it counts in the shares (the time its training thread was blocked, "
                       "beyond the usual, as other)")
        else:
            counted = ("those steps are left out of the shares, so the shares do not include "
                       "it")
        notes.append(f"Step {s.step} took {s.seconds:.1f} s ({s.share:.0%} of the run, "
                     f"{s.times_median:.0f}x the median step) and fell in {s.where}: {counted}.")
    more = len(named) - MAX_FINDINGS
    if more > 0:
        notes.append(f"{more} more step(s) took {STALL_FACTOR:.0f}x the median step or more.")
    return notes


def warmup_notes(table: pd.DataFrame, run_s: float | None = None) -> list[str]:
    """Warm-up steps are never stalls (compilation is slow by nature), but a warm-up that took
    MAJOR_SHARE of the run or more is said, with its longest step: a hang there shows too."""
    notes = []
    warm = table[table["warmup"] & table["in_range"]]
    for rank in sorted({int(r) for r in warm["rank"]}):
        rows = warm[warm["rank"] == rank]
        whole = run_s if run_s and run_s > 0 else float(table.loc[table["rank"] == rank,
                                                                  "wall_s"].sum())
        spent = float(rows["wall_s"].sum())
        if whole > 0 and spent / whole >= MAJOR_SHARE and spent >= MIN_STALL_S:
            longest = rows.sort_values("wall_s").iloc[-1]
            notes.append(f"The {len(rows)} warm-up step(s) of rank {rank} took {spent:.1f} s "
                         f"({spent / whole:.0%} of the run; step {int(longest['step'])} "
                         f"{float(longest['wall_s']):.1f} s): compilation and lazy imports, "
                         "or a stall there; they are left out of the shares.")
            break  # one rank says it for all
    return notes


__all__ = ["Stall", "export_seconds", "find_stalls", "stall_findings", "stall_notes",
           "warmup_notes"]
