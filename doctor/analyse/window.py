"""What the torch.profiler window says about the steps it recorded.

The deep window records a few steady steps in full. The trace analysis (doctor.trace) turns
each profiled step into a row of GPU and host figures (the rules' ``gpu_steps``) and splits it
into input, transfer, compute, communication and other; here the non-input part becomes
fractions (median over the window's steps) that the ledger applies to every step of that rank.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from doctor.categories import NON_INPUT
from doctor.errors import WindowUnavailable

SPLIT_CATEGORIES = NON_INPUT


def window_frame(trace: Path, rank: int) -> pd.DataFrame:
    """One row per profiled step (doctor.trace.steps.STEP_COLUMNS)."""
    try:
        from doctor.trace.steps import trace_step_frame

        frame = trace_step_frame(trace, rank=rank)
    except Exception as err:  # a damaged trace costs the split, not the verdict
        raise WindowUnavailable(f"{type(err).__name__}: {err}") from err
    if frame.empty:
        raise WindowUnavailable("the trace has no profiled step")
    return frame


def window_fractions(frame: pd.DataFrame) -> dict[str, float]:
    """Fractions of a step's non-input time per category, summing to 1."""
    from doctor.trace.shares import category_seconds

    seconds = category_seconds(frame)
    rest = seconds[list(SPLIT_CATEGORIES)]
    totals = rest.sum(axis=1)
    usable = totals > 0
    if not usable.any():
        raise WindowUnavailable("the profiled steps have no time outside input wait")
    per_step = rest[usable].div(totals[usable], axis=0)
    medians = {c: float(np.median(per_step[c])) for c in SPLIT_CATEGORIES}
    total = sum(medians.values())
    if total <= 0:
        raise WindowUnavailable("no time outside input wait")
    return {c: v / total for c, v in medians.items()}
