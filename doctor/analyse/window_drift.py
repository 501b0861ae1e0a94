"""The steps before the profiler window against the steps after it, per rank.

The window leaves traces in the job's process: on a CPU job with large tensors, the profiler's
own large allocations and frees raise glibc's dynamic mmap threshold (up to 32 MiB; the trim
threshold to twice that), and from then on the job's own large tensors stop paying page faults
on every step. The steps after the window are then faster than the job ever is without doctor,
and the analysis, which takes most of its steps from after the window, would report a step time
of doctor's making. The same speed-up is within reach of the bare job (its large tensors pay those
page faults on every step), which is what doctor.rules.allocator says.

``window_drift`` compares, per rank, the median analysed step before the window with the median
analysed step after it. It calls the difference real only when it is large (at least
``MIN_CHANGE``) and beyond the spread of the steps before the window (the typical step after is
faster than the fastest before it, or slower than the slowest), with at least ``MIN_BEFORE``
steps before the window and ``MIN_AFTER`` after it. Warm-up steps are left out on both sides (the
ledger's ``analyzed``); a job whose warm-up outlasts the ledger's warm-up steps can look the same,
which is why the finding it feeds is a measured ``doctor try`` of the fix, not a conclusion.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from doctor.analyse.steps import RankSteps
    from doctor.store.rundata import RunData

MIN_BEFORE = 3
MIN_AFTER = 5
MIN_CHANGE = 0.12  # |after / before - 1| below this is noise, whatever the spread says
#: Minor page faults per step (4 KiB each: 1 MiB a step) from which the faults before the window
#: are the job's large tensors, and the share of them gone after it that says the window moved
#: the allocator's threshold (doctor.probes.page_faults).
MIN_FAULTS = 256
FAULTS_GONE = 0.5


@dataclass(frozen=True)
class WindowDrift:
    """One rank's median analysed step before and after the profiler window (seconds)."""

    rank: int
    before_s: float
    after_s: float
    steps_before: int
    steps_after: int
    before_min_s: float
    before_max_s: float
    faults_before: float | None = None  # minor page faults per step, just before the window
    faults_after: float | None = None  # and a few steps after it

    @property
    def allocator(self) -> bool | None:
        """Whether the page faults say the window changed the allocator: many faults a step
        before it, most of them gone after it (None: not measured)."""
        if self.faults_before is None or self.faults_after is None:
            return None
        return (self.faults_before >= MIN_FAULTS
                and self.faults_after <= self.faults_before * (1 - FAULTS_GONE))

    @property
    def ratio(self) -> float:
        """after / before: below 1, the steps after the window are faster."""
        return self.after_s / self.before_s

    @property
    def faster(self) -> bool:
        """The steps after the window are faster, beyond noise."""
        return self.ratio <= 1 - MIN_CHANGE and self.after_s < self.before_min_s

    @property
    def slower(self) -> bool:
        """The steps after the window are slower, beyond noise."""
        return self.ratio >= 1 + MIN_CHANGE and self.after_s > self.before_max_s

    def to_dict(self) -> dict[str, float | int | None]:
        return {"rank": self.rank, "median_step_before_window_s": self.before_s,
                "median_step_after_window_s": self.after_s, "after_over_before": self.ratio,
                "steps_before_window": self.steps_before,
                "steps_after_window": self.steps_after,
                **({"page_faults_per_step_before_window": self.faults_before,
                    "page_faults_per_step_after_window": self.faults_after}
                   if self.faults_before is not None else {})}


def window_drift(ledger: pd.DataFrame,
                 faults: dict[int, tuple[float, float]] | None = None) -> tuple[WindowDrift, ...]:
    """Each rank's before/after medians, for the ranks whose ledger has a window with enough
    analysed steps on both sides of it (the whole ledger: ``analyzed`` and the window's flags),
    with the rank's page faults per step before and after the window where ``faults`` has them
    (``fault_rates``)."""
    need = {"rank", "step", "wall_s", "analyzed", "in_window", "window_close"}
    if ledger is None or ledger.empty or not need <= set(ledger.columns):
        return ()
    out = []
    for rank in sorted(ledger["rank"].unique()):
        rows = ledger[ledger["rank"] == rank].sort_values("step")
        window = (rows["in_window"] | rows["window_close"]).to_numpy()
        if not window.any():
            continue
        steps = rows["step"].to_numpy()
        first, last = steps[window].min(), steps[window].max()
        analysed = rows["analyzed"].to_numpy() & (rows["wall_s"].to_numpy() > 0)
        before = rows.loc[analysed & (steps < first), "wall_s"]
        after = rows.loc[analysed & (steps > last), "wall_s"]
        if len(before) < MIN_BEFORE or len(after) < MIN_AFTER:
            continue
        rates = (faults or {}).get(int(rank), (None, None))
        out.append(WindowDrift(int(rank), float(before.median()), float(after.median()),
                               len(before), len(after), float(before.min()),
                               float(before.max()), *rates))
    return tuple(out)


def fault_rates(run: RunData, ranks: dict[int, RankSteps]) -> dict[int, tuple[float, float]]:
    """Each rank's minor page faults per step in the span before the window and the span after
    it (the ``page_faults`` ring: doctor.probes.page_faults), the steps counted from the rank's
    step boundaries inside each span."""
    out = {}
    for rank, steps in ranks.items():
        t0, t1, counts = run.intervals_of(steps.process, "page_faults")
        if len(t0) != 2 or steps.window_ns is None:
            continue
        rates = []
        for a, b, n in zip(t0, t1, counts, strict=True):
            inside = int(np.count_nonzero((steps.ends_ns > a) & (steps.ends_ns <= b)))
            if inside == 0:
                break
            rates.append(float(n) / inside)
        if len(rates) == 2 and t1[0] <= steps.window_ns[0] <= t0[1]:
            out[rank] = (rates[0], rates[1])
    return out


def drift_notes(drifts: tuple[WindowDrift, ...], device: str = "cpu") -> list[str]:
    """What the verdict says where the steps after the window differ from those before it."""
    notes = []
    for d in drifts:
        if d.faster:
            faults = (f" (page faults a step: {d.faults_before:.0f} before, "
                      f"{d.faults_after:.0f} after)" if d.faults_before is not None else "")
            if d.allocator is False:
                why = (f"not the allocator{faults}: the job's own pace changed (a warm-up longer "
                       "than the ledger's), or other work on the machine did")
            elif device == "cpu":
                why = ("the window's large allocations "
                       + ("raised" if d.allocator else "most likely raised")
                       + f" glibc's mmap threshold{faults}, so the job's own large tensors "
                       "stopped paying page faults: the analysed steps (mostly after the window) "
                       "are faster than the job runs without doctor (the allocator finding has "
                       "the same speed-up for the bare job)")
            else:
                why = ("the analysed steps (mostly after the window) are faster than the job's "
                       "first steps")
            notes.append(
                f"Rank {d.rank}: the steps after the profiler window ran {1 - d.ratio:.0%} faster "
                f"than the {d.steps_before} steps before it (median {d.after_s * 1e3:.1f} ms vs "
                f"{d.before_s * 1e3:.1f} ms): {why}.")
        elif d.slower:
            notes.append(
                f"Rank {d.rank}: the steps after the profiler window ran {d.ratio - 1:.0%} slower "
                f"than the {d.steps_before} steps before it (median {d.after_s * 1e3:.1f} ms vs "
                f"{d.before_s * 1e3:.1f} ms): the job changed pace over the run (or something "
                "else on the machine did); the analysed steps are mostly the later ones.")
    return notes
