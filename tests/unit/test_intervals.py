from __future__ import annotations

import numpy as np

from doctor.trace.intervals import overlap_per_span, union


def test_overlap_counts_only_the_shared_part() -> None:
    starts, ends = np.array([1.0, 5.0]), np.array([3.0, 9.0])
    spans_s, spans_e = np.array([0.0, 2.0, 4.0, 8.0]), np.array([2.0, 4.0, 8.0, 20.0])
    assert list(overlap_per_span(starts, ends, spans_s, spans_e)) == [1.0, 1.0, 3.0, 1.0]


def test_overlap_with_no_intervals_is_zero() -> None:
    out = overlap_per_span(np.zeros(0), np.zeros(0), np.array([0.0]), np.array([5.0]))
    assert list(out) == [0.0]


def test_overlap_of_an_interval_spanning_many_spans() -> None:
    out = overlap_per_span(np.array([0.0]), np.array([10.0]),
                           np.array([0.0, 4.0, 8.0]), np.array([4.0, 8.0, 12.0]))
    assert list(out) == [4.0, 4.0, 2.0]


def test_union_merges_overlaps_and_keeps_gaps() -> None:
    s, e = union(np.array([5.0, 1.0, 2.0, 10.0]), np.array([6.0, 4.0, 3.0, 11.0]))
    assert list(s) == [1.0, 5.0, 10.0]
    assert list(e) == [4.0, 6.0, 11.0]
