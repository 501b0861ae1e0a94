"""A process's profiler window, read from its trace into the step frame (doctor.trace.steps)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from doctor.errors import WindowUnavailable


def read_window(trace: Path, rank: int) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(one row per profiled step (doctor.trace.steps.STEP_COLUMNS), one row per op
    (doctor.trace.ops.OP_COLUMNS), one row per collective (doctor.trace.comm_calls)), from one
    read of the trace; WindowUnavailable when the trace cannot be read or has no step (a damaged
    trace costs the split, not the verdict)."""
    from doctor.trace.comm_calls import collective_calls
    from doctor.trace.events import load_timeline
    from doctor.trace.ops import op_table
    from doctor.trace.steps import step_frame_from_timeline

    try:
        timeline = load_timeline(trace)
        frame = step_frame_from_timeline(timeline, rank)
    except Exception as err:
        raise WindowUnavailable(f"{type(err).__name__}: {err}") from err
    if frame.empty:
        raise WindowUnavailable("the trace has no profiled step")
    return frame, op_table(timeline), collective_calls(timeline)
