"""A training process's GradScaler updates as recorded (probes/steps.py, probes/amp.py): when each
ended, whether its iteration was skipped, and the scale the iteration ran with and the one the
update left.

An iteration was skipped where no optimizer stepped since the last update (the scaler found
inf/NaN gradients and did not call ``optimizer.step()``), or where the update lowered the scale:
an optimizer that handles the scaler itself (``fused=True`` Adam under a scaler) is called
every iteration and skips inside its kernel, so only the scale says so. A scale set by hand
(``update(new_scale)``) lower than the last reads as a skip too. The probe records the scale
where it changed; it holds until the next reading. On a GPU a reading is late and may be dropped
(doctor.record.late_reads): a change whose reading was dropped shows at the next one read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from doctor.store.process_rows import Process
from doctor.store.records import scale_of_key
from doctor.store.rundata import RunData


@dataclass(frozen=True)
class Updates:
    """One process's scaler updates, in the order they ended."""

    ends_ns: np.ndarray  # each update's end
    skipped: np.ndarray  # bool: the iteration it ended was skipped
    scale_before: np.ndarray  # the scale the iteration ran with (nan: not read)
    scale_after: np.ndarray  # the scale the update left (nan: not read)

    def __len__(self) -> int:
        return len(self.ends_ns)


def scaler_updates(run: RunData, process: Process) -> Updates | None:
    """The process's updates (None: it updated no GradScaler)."""
    t0, t1, stepped = run.intervals_of(process, "scaler")
    if not len(t1):
        return None
    order = np.argsort(t1, kind="stable")
    starts, ends, stepped = t0[order], t1[order], stepped[order]
    s0, _s1, keys = run.intervals_of(process, "scale")
    by_time = np.argsort(s0, kind="stable")
    times = s0[by_time]
    values = np.array([scale_of_key(int(k)) for k in keys[by_time]] + [np.nan], np.float64)
    # the scale holds from each reading on (the probe records the changes only); -1: none yet
    after = values[np.searchsorted(times, ends, "right") - 1]
    first = values[np.searchsorted(times, starts[:1], "right") - 1]
    before = np.concatenate((first, after[:-1]))
    with np.errstate(invalid="ignore"):
        lowered = after < before
    return Updates(ends_ns=ends, skipped=(stepped == 0) | lowered, scale_before=before,
                   scale_after=after)
