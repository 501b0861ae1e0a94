"""Each rank's iterations as its GradScaler saw them: how many ran, how many the scaler skipped
(inf/NaN gradients: the optimizer did not step, the forward and backward were wasted), how many
micro-batches (``backward()`` calls) each iteration ran (gradient accumulation), and the scale
over the run.

The steps probe records every ``GradScaler.update()`` with whether an optimizer stepped since the
last one, and the scale each update left (probes/steps.py, probes/amp.py; which iterations were
skipped: doctor.analyse.scaler). The first skips of a run are the scaler calibrating (its scale
starts high and halves at each overflow): the leading run of skipped iterations is counted
apart. The scale *collapses* where it falls below 1: gradients are then scaled down, not up, and
torch's own documentation says something is wrong (inf or NaN whatever the scale). Nothing here
decides anything: doctor.rules.iterations reads it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from doctor.analyse.scaler import scaler_updates
from doctor.analyse.steps import RankSteps
from doctor.store.rundata import RunData

NS = 1e-9
NAN = float("nan")


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
    calibrating_s: float = 0.0  # wall time of the leading run of skipped iterations
    scale_first: float = NAN  # the scale the first iteration ran with (nan: not read)
    scale_settled: float = NAN  # the scale the first stepped iteration ran with
    scale_last: float = NAN  # the scale the last update left
    scale_lowest: float = NAN
    collapsed_at: int | None = None  # the first iteration after which the scale was below 1

    @property
    def skipped_later(self) -> int:
        """Skipped iterations past the scaler's calibration at the start."""
        return self.skipped - self.calibrating

    @property
    def wasted_share(self) -> float:
        return self.wasted_s / self.run_s if self.run_s > 0 else 0.0

    @property
    def calibrating_share(self) -> float:
        return self.calibrating_s / self.run_s if self.run_s > 0 else 0.0


def iterations(run: RunData, ranks: Mapping[int, RankSteps]) -> dict[int, Iterations]:
    """Per rank whose training process updated a GradScaler twice or more, its iterations."""
    out: dict[int, Iterations] = {}
    for rank, r in ranks.items():
        updates = scaler_updates(run, r.process)
        if updates is None or len(updates) < 2:
            continue
        ends, skipped = updates.ends_ns, updates.skipped
        leading = int(np.argmax(~skipped)) if (~skipped).any() else len(skipped)
        walls = np.diff(ends) * NS  # iteration i (from 1) ran between updates i-1 and i
        later = skipped[1:].copy()
        later[: max(0, leading - 1)] = False
        first = skipped[1:] & ~later
        _b0, b1, _ = run.intervals_of(r.process, "backward")
        micro = float(np.median(np.histogram(b1, bins=ends)[0])) if len(b1) else NAN
        before, after = updates.scale_before, updates.scale_after
        known = after[~np.isnan(after)]
        below = np.flatnonzero(after < 1.0)
        out[rank] = Iterations(
            rank=rank, count=len(ends), skipped=int(skipped.sum()), calibrating=leading,
            wasted_s=float(walls[later].sum()), run_s=float(walls.sum()),
            micro_batches=micro, calibrating_s=float(walls[first].sum()),
            scale_first=_first(before), scale_settled=_first(before[~skipped]),
            scale_last=float(known[-1]) if len(known) else NAN,
            scale_lowest=float(np.min(np.concatenate((known, before[~np.isnan(before)]))))
            if len(known) or not np.isnan(before).all() else NAN,
            collapsed_at=int(below[0]) + 1 if len(below) else None)
    return out


def _first(values: np.ndarray) -> float:
    known = values[~np.isnan(values)]
    return float(known[0]) if len(known) else NAN


def scale_words(scale: float) -> str:
    """A scale as a power of two where it is one ('2^-22'), else its value."""
    if math.isnan(scale) or scale <= 0 or math.isinf(scale):
        return f"{scale:g}"
    exponent = math.log2(scale)
    return f"2^{round(exponent)}" if abs(exponent - round(exponent)) < 0.01 else f"{scale:.3g}"
