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

import pandas as pd

MIN_BEFORE = 3
MIN_AFTER = 5
MIN_CHANGE = 0.12  # |after / before - 1| below this is noise, whatever the spread says


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

    def to_dict(self) -> dict[str, float | int]:
        return {"rank": self.rank, "median_step_before_window_s": self.before_s,
                "median_step_after_window_s": self.after_s, "after_over_before": self.ratio,
                "steps_before_window": self.steps_before,
                "steps_after_window": self.steps_after}


def window_drift(ledger: pd.DataFrame) -> tuple[WindowDrift, ...]:
    """Each rank's before/after medians, for the ranks whose ledger has a window with enough
    analysed steps on both sides of it (the whole ledger: ``analyzed`` and the window's flags)."""
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
        out.append(WindowDrift(int(rank), float(before.median()), float(after.median()),
                               len(before), len(after), float(before.min()),
                               float(before.max())))
    return tuple(out)


def drift_notes(drifts: tuple[WindowDrift, ...], device: str = "cpu") -> list[str]:
    """What the verdict says where the steps after the window differ from those before it."""
    notes = []
    for d in drifts:
        if d.faster:
            why = ("most likely the window's large allocations raised glibc's mmap threshold, so "
                   "the job's own large tensors stopped paying page faults: the analysed steps "
                   "(mostly after the window) are faster than the job runs without doctor (the "
                   "allocator finding has the same speed-up for the bare job)"
                   if device == "cpu" else
                   "the analysed steps (mostly after the window) are faster than the job's first "
                   "steps")
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
