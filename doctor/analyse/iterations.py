"""Each rank's iterations as its GradScaler saw them: how many ran, how many the scaler skipped
(inf/NaN gradients: the optimizer did not step, the forward and backward were wasted), and how
many micro-batches (``backward()`` calls) each iteration ran (gradient accumulation).

The steps probe records every ``GradScaler.update()`` with whether an optimizer stepped since the
last one (probes/steps.py), without reading a tensor. The first skips of a run are the scaler
calibrating (its scale starts high and halves at each overflow): the leading run of skipped
iterations is counted apart. Nothing here decides anything: doctor.rules.iterations reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from doctor.analyse.steps import RankSteps
from doctor.store.rundata import RunData

NS = 1e-9


@dataclass(frozen=True)
class Iterations:
    """One rank's iterations under a GradScaler."""

    rank: int
    count: int  # iterations (scaler updates)
    skipped: int  # of them, those whose optimizer step the scaler skipped
    calibrating: int  # of the skipped, the leading run from the first iteration on
    wasted_s: float  # wall time of the skipped iterations past the calibration
    run_s: float  # wall time of all the iterations (first update to last)
    micro_batches: float  # median backward() calls per iteration (nan: none recorded)

    @property
    def skipped_later(self) -> int:
        """Skipped iterations past the scaler's calibration at the start."""
        return self.skipped - self.calibrating

    @property
    def wasted_share(self) -> float:
        return self.wasted_s / self.run_s if self.run_s > 0 else 0.0


def iterations(run: RunData, ranks: Mapping[int, RankSteps]) -> dict[int, Iterations]:
    """Per rank whose training process updated a GradScaler twice or more, its iterations."""
    out: dict[int, Iterations] = {}
    for rank, r in ranks.items():
        _t0, t1, stepped = run.intervals_of(r.process, "scaler")
        if len(t1) < 2:
            continue
        order = np.argsort(t1, kind="stable")
        ends, skipped = t1[order], stepped[order] == 0
        leading = int(np.argmax(~skipped)) if (~skipped).any() else len(skipped)
        walls = np.diff(ends) * NS  # iteration i (from 1) ran between updates i-1 and i
        later = skipped[1:].copy()
        later[: max(0, leading - 1)] = False
        _b0, b1, _ = run.intervals_of(r.process, "backward")
        micro = float(np.median(np.histogram(b1, bins=ends)[0])) if len(b1) else float("nan")
        out[rank] = Iterations(
            rank=rank, count=len(ends), skipped=int(skipped.sum()), calibrating=leading,
            wasted_s=float(walls[later].sum()), run_s=float(walls.sum()),
            micro_batches=micro)
    return out
