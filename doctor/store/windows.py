"""A process's profiler window, read from its trace into the step frame (doctor.trace.steps), its
ops and collectives (doctor.trace.tables: TraceTables), and its events on the process's own clock
(for the timeline)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from doctor.errors import WindowUnavailable

if TYPE_CHECKING:
    from doctor.trace.tables import TraceTables

#: How far (ns) the window's events may sit outside the window's own span on the process's clock
#: before the clock pair is not believed (an old run without one, a clock stepped by NTP).
CLOCK_SLACK_NS = 2_000_000_000


def read_window(trace: Path, rank: int) -> TraceTables:
    """The window of one trace, from one read of it by doctor.trace's one entry point (as a
    trace analysed on its own is read), with its events; WindowUnavailable when the trace cannot
    be read or has no step (a damaged trace costs the split, not the verdict)."""
    from doctor.trace.tables import read_traces

    try:
        [tables] = read_traces([trace], [rank], events=True, workers=1)
    except Exception as err:
        raise WindowUnavailable(f"{type(err).__name__}: {err}") from err
    if tables.steps.empty:
        raise WindowUnavailable("the trace has no profiled step")
    return tables


def on_process_clock(events: pd.DataFrame, window: dict[str, Any],
                     span_ns: tuple[int, int] | None) -> pd.DataFrame:
    """The window's events with ``t0_ns``/``t1_ns`` on the process's clock (its rings'): by the
    clock pair the window recorded as it opened (``window["clock"]``: session ns, Unix ns), else,
    or when that puts them outside the window's span (``span_ns``: its start and stop events),
    by its first event at the window's start."""
    start_us = events["start_us"].to_numpy(np.float64)
    end_us = events["end_us"].to_numpy(np.float64)
    offset: float | None = None
    pair = window.get("clock")
    if (isinstance(pair, list | tuple) and len(pair) == 2
            and all(isinstance(t, int) and not isinstance(t, bool) for t in pair)):
        offset = (int(pair[1]) - int(pair[0])) / 1e3  # Unix us minus session us
    if len(start_us) and span_ns is not None:
        first = (start_us.min() - (offset or 0.0)) * 1e3
        last = (end_us.max() - (offset or 0.0)) * 1e3
        lo, hi = span_ns[0] - CLOCK_SLACK_NS, span_ns[1] + CLOCK_SLACK_NS
        if offset is None or first < lo or last > hi:
            offset = start_us.min() - span_ns[0] / 1e3
    if offset is None:
        return events.iloc[0:0].assign(t0_ns=np.zeros(0, np.int64), t1_ns=np.zeros(0, np.int64))
    return events.assign(t0_ns=np.round((start_us - offset) * 1e3).astype(np.int64),
                         t1_ns=np.round((end_us - offset) * 1e3).astype(np.int64))
