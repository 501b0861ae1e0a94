"""Interval arithmetic on sorted numpy arrays (nanoseconds or seconds, any unit)."""

from __future__ import annotations

import numpy as np


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


def union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge possibly overlapping intervals into sorted, non-overlapping ones."""
    if len(starts) == 0:
        return np.asarray(starts, dtype=np.float64), np.asarray(ends, dtype=np.float64)
    order = np.argsort(starts, kind="stable")
    s = np.asarray(starts, dtype=np.float64)[order]
    e = np.maximum.accumulate(np.asarray(ends, dtype=np.float64)[order])
    new = np.concatenate([[True], s[1:] > e[:-1]])
    group = np.cumsum(new) - 1
    out_s = s[new]
    out_e = np.zeros(len(out_s))
    np.maximum.at(out_e, group, e)
    return out_s, out_e
