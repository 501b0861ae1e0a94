"""A process's profiler window, read from its trace into the step frame (doctor.trace.steps)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from doctor.errors import WindowUnavailable


def read_window(trace: Path, rank: int) -> pd.DataFrame:
    """One row per profiled step (doctor.trace.steps.STEP_COLUMNS); WindowUnavailable when the
    trace cannot be read or has no step (a damaged trace costs the split, not the verdict)."""
    from doctor.trace.steps import trace_step_frame

    try:
        frame = trace_step_frame(trace, rank=rank)
    except Exception as err:
        raise WindowUnavailable(f"{type(err).__name__}: {err}") from err
    if frame.empty:
        raise WindowUnavailable("the trace has no profiled step")
    return frame
