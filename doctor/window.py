"""What the torch.profiler window says about the non-input part of a step.

The deep window records a few steady steps in full. Per profiled step, the trace analysis
(doctor.trace) splits the step into input, transfer, compute, communication and other; here the
non-input part is turned into fractions (median over the window's steps) that the ledger applies
to every step of that rank.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SPLIT_CATEGORIES = ("transfer", "compute", "communication", "other")


class WindowUnavailable(Exception):
    """The window's trace could not be read or has no usable step."""


def window_fractions(trace: Path) -> dict[str, float]:
    """Fractions of a step's non-input time per category, summing to 1."""
    try:
        from doctor.trace.shares import category_seconds
        from doctor.trace.steps import trace_step_frame

        frame = trace_step_frame(trace)
        seconds = category_seconds(frame)
    except Exception as err:  # a damaged trace costs the split, not the verdict
        raise WindowUnavailable(f"{type(err).__name__}: {err}") from err
    if seconds.empty:
        raise WindowUnavailable("the trace has no profiled step")
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
