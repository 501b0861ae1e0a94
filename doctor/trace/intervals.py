"""Interval arithmetic on numpy arrays: unions, intersections and differences of time spans.

An *interval set* is a pair ``(starts, ends)`` of float arrays, sorted, disjoint and non-empty
(``starts[i] < ends[i] < starts[i + 1]``), as :func:`union` returns. Everything here is vectorised:
a trace's hundreds of thousands of kernels cost a sort and a few passes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
Spans = tuple[FloatArray, FloatArray]

__all__ = [
    "EMPTY",
    "Spans",
    "clip",
    "combine",
    "count_starts",
    "covered_before",
    "difference",
    "intersection",
    "length",
    "overlap_per_span",
    "union",
    "union_of",
]

EMPTY: Spans = (np.empty(0, dtype=np.float64), np.empty(0, dtype=np.float64))


def union(starts: npt.ArrayLike, ends: npt.ArrayLike) -> Spans:
    """The union of possibly overlapping intervals, as a sorted disjoint interval set."""
    s = np.asarray(starts, dtype=np.float64)
    e = np.asarray(ends, dtype=np.float64)
    keep = e > s
    s, e = s[keep], e[keep]
    if s.size == 0:
        return EMPTY
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    # a new group starts where an interval begins after everything before it has ended
    gap = s[1:] > reach[:-1]
    first = np.concatenate(([True], gap))
    last = np.concatenate((gap, [True]))
    return s[first], reach[last]


def union_of(*sets: Spans) -> Spans:
    """The union of several interval sets."""
    if not sets:
        return EMPTY
    return union(np.concatenate([s for s, _ in sets]), np.concatenate([e for _, e in sets]))


def length(spans: Spans) -> float:
    """Total time covered by an interval set."""
    s, e = spans
    return float(np.sum(e - s)) if s.size else 0.0


def clip(spans: Spans, lo: float, hi: float) -> Spans:
    """The part of an interval set inside the window ``[lo, hi)``."""
    s, e = spans
    if s.size == 0 or hi <= lo:
        return EMPTY
    i = int(np.searchsorted(e, lo, side="right"))
    j = int(np.searchsorted(s, hi, side="left"))
    if j <= i:
        return EMPTY
    cs = np.maximum(s[i:j], lo)
    ce = np.minimum(e[i:j], hi)
    keep = ce > cs
    return cs[keep], ce[keep]


def _covered(spans: Spans, points: FloatArray) -> npt.NDArray[np.bool_]:
    s, e = spans
    if s.size == 0:
        return np.zeros(points.shape, dtype=bool)
    inside: npt.NDArray[np.bool_] = (
        np.searchsorted(s, points, side="right") - np.searchsorted(e, points, side="right")
    ) > 0
    return inside


def combine(
    sets: list[Spans],
    keep: Callable[[list[npt.NDArray[np.bool_]]], npt.NDArray[np.bool_]],
) -> Spans:
    """Combine interval sets with a boolean function of their coverage.

    The time line is cut at every boundary; ``keep`` receives, for each set, a boolean array saying
    whether it covers each elementary segment, and returns which segments to keep. Kept neighbours
    are merged back into intervals.
    """
    bounds = [b for s, e in sets for b in (s, e) if b.size]
    if not bounds:
        return EMPTY
    cuts = np.unique(np.concatenate(bounds))
    if cuts.size < 2:
        return EMPTY
    mids = (cuts[:-1] + cuts[1:]) / 2.0
    chosen = keep([_covered(spans, mids) for spans in sets])
    if not chosen.any():
        return EMPTY
    lo, hi = cuts[:-1][chosen], cuts[1:][chosen]
    joined = np.concatenate(([True], lo[1:] > hi[:-1]))
    ends_at = np.concatenate((joined[1:], [True]))
    return lo[joined], hi[ends_at]


def intersection(a: Spans, b: Spans) -> Spans:
    """Time covered by both ``a`` and ``b``."""
    if a[0].size == 0 or b[0].size == 0:
        return EMPTY
    return combine([a, b], lambda c: c[0] & c[1])


def difference(a: Spans, *others: Spans) -> Spans:
    """Time covered by ``a`` and by none of ``others``."""
    rest = [o for o in others if o[0].size]
    if a[0].size == 0 or not rest:
        return a
    return combine([a, *rest], lambda c: c[0] & ~np.logical_or.reduce(c[1:]))


def count_starts(starts: FloatArray, lo: float, hi: float) -> int:
    """How many of the sorted ``starts`` fall in ``[lo, hi)``."""
    return int(np.searchsorted(starts, hi, side="left") - np.searchsorted(starts, lo, side="left"))


def covered_before(starts: np.ndarray, ends: np.ndarray, points: np.ndarray) -> np.ndarray:
    """For sorted, non-overlapping intervals, the total interval time before each point."""
    points = np.asarray(points, dtype=np.float64)
    if len(starts) == 0:
        return np.zeros(len(points))
    starts = np.asarray(starts, dtype=np.float64)
    durations = np.asarray(ends, dtype=np.float64) - starts
    done = np.concatenate([[0.0], np.cumsum(durations)])  # time in intervals before index i
    idx = np.searchsorted(starts, points, side="right") - 1
    inside = np.where(idx >= 0,
                      np.clip(points - starts[np.maximum(idx, 0)], 0.0,
                              durations[np.maximum(idx, 0)]), 0.0)
    return done[np.maximum(idx, 0)] * (idx >= 0) + inside


def overlap_per_span(starts: np.ndarray, ends: np.ndarray,
                     span_starts: np.ndarray, span_ends: np.ndarray) -> np.ndarray:
    """Time each span [span_start, span_end) shares with the sorted, non-overlapping intervals."""
    return (covered_before(starts, ends, span_ends)
            - covered_before(starts, ends, span_starts))
