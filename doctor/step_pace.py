"""A run's time a step: its pace, the mean of its steps with the fastest and the slowest TRIM of
them left out.

Not the median: workers that finish their batches together hand them over in pairs, a long
wait then none, and the median of such steps lands on either kind (two workers on a 32 ms batch
measured 33 ms, as if one), while the pace is what the job gets through; the trim keeps a GC
pause or a stray stall from moving it. Used by doctor try's measurements
(doctor.tries.measure) and the input rules' model (doctor.rules.input_model).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

#: The share of the fastest steps and of the slowest left out of a run's pace.
TRIM = 0.1


def pace(step_s: Sequence[float]) -> float | None:
    """The time a step of a run, None without steps."""
    if not step_s:
        return None
    ordered = sorted(step_s)
    cut = int(len(ordered) * TRIM)
    kept = ordered[cut:len(ordered) - cut]
    return statistics.fmean(kept)
