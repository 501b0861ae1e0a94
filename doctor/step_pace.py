"""A run's time a step: its pace, the mean of its steps with the fastest and the slowest TRIM of
them left out (at least one of each from MIN_TRIMMED steps on).

Not the median: workers that finish their batches together hand them over in pairs, a long
wait then none, and the median of such steps lands on either kind (two workers on a 32 ms batch
measured 33 ms, as if one), while the pace is what the job gets through; the trim keeps a lone
stray stall from moving it. The trim is light: a loader whose bursts are one batch in eleven
(9 % of the steps) has them in its pace; a trim of 10 % left them all out, and doctor try
measured 0.96x for a deeper queue that took the job's loop from 6.26 s to 4.70 s. Used by
doctor try's measurements (doctor.tries.measure) and the input rules' model
(doctor.rules.input_model).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

#: The share of the fastest steps and of the slowest left out of a run's pace...
TRIM = 0.01
MIN_TRIMMED = 20  # ...where there are this many steps (fewer: none left out)


def pace(step_s: Sequence[float]) -> float | None:
    """The time a step of a run, None without steps."""
    if not step_s:
        return None
    ordered = sorted(step_s)
    cut = math.ceil(len(ordered) * TRIM) if len(ordered) >= MIN_TRIMMED else 0
    kept = ordered[cut:len(ordered) - cut]
    return statistics.fmean(kept)
