"""Bursty input: DataLoader workers that keep up on average while a few slow batches drain the
queue. Most steps then wait for nothing and a few wait long; more workers are the fix for
workers slow on average, a deeper queue (``prefetch_factor``) the fix for bursts.

Found from the wait per step: with workers, the longest-waiting TOP of the steps hold at least
HELD of the wait, a typical long wait (their median) is at least LONG times the median step's
(which is taking a batch from a worker, where the queue keeps up), and the
workers keep up on average: each serves every n-th batch in turn, so the slowest one's mean time
per batch (its ``fetch`` intervals) must fit in n training steps (a worker that gets every slow
batch, or workers slow on average, wait the same way and are no burst). The queue
holds ``num_workers * prefetch_factor`` batches (prefetch_factor 2 by default); a slow batch was
dispatched that many batches before it is needed and still made the loop wait the typical burst
(the median wait of the top steps): its loading took the burst plus that queue's training steps.
It is hidden when the queue's batches take the loop at least that long, so the queue needs the
burst plus a step's own training time, in training steps, beyond what it holds:
``prefetch_factor`` grows by that over the workers (at most MAX_PREFETCH). (Sized from the burst
alone, the queue the job already had was forgotten: bursty_loader's 2 workers got 3 for 2, which
hid nothing, where 8 took its loop 1.33x faster.) Hidden bursts leave the step without the waits
above the median step's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from doctor.verdict import Fix

TOP = 0.15  # the longest-waiting share of the steps...
HELD = 0.6  # ...hold at least this share of the wait
LONG = 5.0  # a typical long wait is this many times the median step's wait, or more
DEFAULT_PREFETCH = 2  # the DataLoader's own default with workers
MAX_PREFETCH = 32


@dataclass(frozen=True)
class Bursts:
    """The waits of a bursty loader and the prefetch_factor that would hide them."""

    burst_s: float  # a typical long wait
    usual_s: float  # the median step's wait
    bursts: int  # steps with a long wait
    steps: int
    train_s: float  # the median step's time outside the wait
    prefetch: int  # the job's prefetch_factor
    suggested: int
    speedup: float

    def fix(self, workers: int) -> Fix:
        return Fix(
            title=f"Bursty batches: {self.bursts} of {self.steps} steps wait "
                  f"{self.burst_s * 1e3:.0f} ms, the median step {self.usual_s * 1e3:.1f} ms: "
                  f"set prefetch_factor={self.suggested}",
            why=f"The {workers} workers keep up on average, but a slow batch empties the queue "
                f"of {workers * self.prefetch} batches (num_workers x prefetch_factor "
                f"{self.prefetch}) that {self.train_s * 1e3:.0f} ms training steps drain: a "
                f"queue of {workers * self.suggested} batches rides out a "
                f"{self.burst_s * 1e3:.0f} ms batch. More workers also deepen it (and cost "
                "cores); each queued batch is held in shared memory.",
            code=f"DataLoader(dataset, num_workers={workers}, prefetch_factor={self.suggested}, "
                 "persistent_workers=True)",
            apply={"dataloader": {"prefetch_factor": self.suggested,
                                  "persistent_workers": True}},
            estimated_speedup=self.speedup)


def bursts(ledger: pd.DataFrame, workers: int, prefetch: int | None,
           slowest_fetch_s: float | None) -> Bursts | None:
    """The bursts of the ledger's waits (None: a loader without workers, not bursty, or workers
    whose batches were not timed)."""
    if workers <= 0 or "wait_s" not in ledger or len(ledger) < 10 or slowest_fetch_s is None:
        return None
    wait = ledger["wait_s"].to_numpy(np.float64)
    wall = ledger["wall_s"].to_numpy(np.float64)
    total = float(wait.sum())
    if total <= 0:
        return None
    train = float(np.median(wall - wait))
    top_n = max(1, math.ceil(TOP * len(wait)))
    longest = np.sort(wait)[::-1][:top_n]
    burst = float(np.median(longest))
    if float(longest.sum()) < HELD * total or burst < LONG * float(np.median(wait)) or \
            slowest_fetch_s > workers * train:
        return None
    long = int((wait >= 0.5 * burst).sum())
    have = prefetch if prefetch and prefetch > 0 else DEFAULT_PREFETCH
    more = (burst + train) / max(train, 1e-6)  # batches in flight beyond today's to hide it
    suggested = min(MAX_PREFETCH, have + math.ceil(more / workers))
    quiet = float(np.median(wait))
    after = float(np.mean(wall - np.maximum(wait - quiet, 0.0)))
    return Bursts(burst, quiet, long, len(wait), train, have, suggested,
                  float(np.mean(wall)) / max(after, 1e-9))
