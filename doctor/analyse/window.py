"""What the torch.profiler window says about the steps it did not record.

The deep window records a few steady steps in full; each is a row of the window frame
(doctor.trace.steps), split into input, transfer, compute, communication and other
(doctor.trace.shares). Here the part outside the input wait becomes fractions (the median over
the window's steps) that the ledger applies to every step of the rank, and so does the share of
that time the device spends computing (GPU kernels on a GPU job; on a CPU job the device is the
CPU, and its compute is the compute fraction).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from doctor.analyse.steps import WINDOW, RankSteps
from doctor.categories import NON_INPUT
from doctor.errors import WindowUnavailable
from doctor.store.process_rows import of_processes
from doctor.store.rundata import RunData
from doctor.trace.shares import category_seconds


@dataclass(frozen=True)
class WindowSplit:
    """One rank's window: fractions of the time outside the input wait (summing to 1)."""

    fractions: dict[str, float]
    device: str  # cuda | cpu
    device_compute: float  # fraction of that time the device computes


def window_frame(run: RunData, ranks: dict[int, RankSteps]) -> pd.DataFrame:
    """The window steps of the training processes (one rank's window is its main process's)."""
    return of_processes(run.window, (r.process for r in ranks.values())).reset_index(drop=True)


def window_splits(run: RunData, ranks: dict[int, RankSteps]
                  ) -> tuple[dict[int, WindowSplit], dict[int, str]]:
    """(the split of each rank whose window has time outside the input wait, why the others'
    windows could not be used). Ranks whose steps are the window's own need no split."""
    splits: dict[int, WindowSplit] = {}
    problems: dict[int, str] = {}
    for rank, steps in ranks.items():
        rows = run.rows("window", steps.process)
        if rows.empty or steps.kind == WINDOW:
            continue
        try:
            splits[rank] = window_split(rows)
        except WindowUnavailable as err:
            problems[rank] = f"trace unusable: {err}"
    return splits, problems


def window_split(frame: pd.DataFrame) -> WindowSplit:
    seconds = category_seconds(frame)
    rest = seconds[list(NON_INPUT)]
    totals = rest.sum(axis=1)
    usable = totals > 0
    if not usable.any():
        raise WindowUnavailable("the profiled steps have no time outside input wait")
    per_step = rest[usable].div(totals[usable], axis=0)
    medians = {c: float(np.median(per_step[c])) for c in NON_INPUT}
    total = sum(medians.values())
    if total <= 0:
        raise WindowUnavailable("no time outside input wait")
    fractions = {c: v / total for c, v in medians.items()}
    gpu = bool((frame["device"] == "cuda").any())
    if gpu:
        kernels = frame.loc[usable, "kernel_s"].to_numpy(np.float64) / totals[usable].to_numpy()
        device_compute = float(np.clip(np.median(kernels), 0.0, 1.0))
    else:
        device_compute = fractions["compute"]
    return WindowSplit(fractions, "cuda" if gpu else "cpu", device_compute)
