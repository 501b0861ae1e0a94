"""Mixed precision as each rank's training process ran it: the autocasts it entered, its
GradScalers' settings (doctor.probes.amp), the losses of its backward() calls that were inf or
NaN (read a step late on a GPU), and what autocast's casts cost in its profiler window.

The casts are the copy ops (``aten::to``, ``aten::_to_copy``, ``aten::copy_`` and the
``aten::empty_strided`` each cast allocates): autocast converts each fp32 weight and input to the
16-bit type on the way into a matmul, and its gradients back. On a GPU the copy ops' device time
also holds the host-device copies; the window's own copy time (its steps' ``transfer_s``) is taken
out. Nothing here decides anything: doctor.rules.precision reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from doctor.analyse.ops import RankOps
from doctor.analyse.steps import RankSteps
from doctor.store.records import LOSS_NAN
from doctor.store.rundata import RunData

#: The ops autocast's casts run as (doctor.trace.ops' names).
CAST_OPS = ("aten::copy_", "aten::_to_copy", "aten::to", "aten::empty_strided")


@dataclass(frozen=True)
class RankPrecision:
    """One rank's mixed precision (see the module docstring)."""

    rank: int
    autocasts: tuple[tuple[str, str], ...]  # (device, dtype) of each enabled autocast entered
    scaler: Mapping[str, float] | None  # the first GradScaler's settings (None: none updated)
    nonfinite: int  # backward() calls whose loss was inf or NaN
    nan: int  # of them, NaN
    nonfinite_stepped: int  # of them, in steps whose optimizer stepped anyway (not skipped)
    first_nonfinite_step: int | None  # the first step (ledger numbering) with one
    cast_share: float | None  # the casts' share of the window's op time (None: no op table)
    cast_s: float = 0.0  # their time in the window

    def autocasts_to(self, device: str) -> str | None:
        """The 16-bit type the process autocast to on ``device`` (None: none)."""
        return next((d for dev, d in self.autocasts if dev == device), None)


def rank_precision(run: RunData, main: RankSteps, ledger: pd.DataFrame,
                   ops: RankOps | None) -> RankPrecision:
    """One rank's mixed precision."""
    amp = run.rows("amp", main.process)
    casts = amp[(amp["kind"] == "autocast") & (amp["enabled"] == True)]  # noqa: E712
    autocasts = tuple(dict.fromkeys(zip(casts["device"].astype(str), casts["dtype"].astype(str),
                                        strict=True)))
    scalers = amp[amp["kind"] == "scaler"]
    scaler = None
    if len(scalers):
        row = scalers.iloc[0]
        scaler = {k: float(row[k]) for k in ("init_scale", "growth_factor", "backoff_factor",
                                             "growth_interval") if pd.notna(row[k])}
    b0, b1, key = run.intervals_of(main.process, "nonfinite")
    mine = ledger[ledger["rank"] == main.rank] if "rank" in ledger else ledger
    stepped, first = _steps_of(mine, main, b1)
    share, seconds = _casts(run, main, ops)
    return RankPrecision(
        rank=main.rank, autocasts=autocasts, scaler=scaler, nonfinite=len(b0),
        nan=int((key == LOSS_NAN).sum()), nonfinite_stepped=stepped,
        first_nonfinite_step=first, cast_share=share, cast_s=seconds)


def _steps_of(ledger: pd.DataFrame, main: RankSteps, ends: np.ndarray) -> tuple[int, int | None]:
    """Of the backward() calls ending at ``ends``, how many fell in steps that were not
    skipped (the ledger's rows are the rank's steps in order), and the first such call's step
    number (None: none fell in a step)."""
    if not len(ends) or not len(main.ends_ns) or ledger.empty:
        return 0, None
    index = np.searchsorted(main.ends_ns, ends, "left")
    steps = ledger["step"].to_numpy(np.int64)
    inside = index < min(len(main.ends_ns), len(steps))
    index = index[inside]
    index = index[ends[inside] > main.starts_ns[index]]
    if not len(index):
        return 0, None
    skipped = ledger["skipped"].to_numpy(bool) if "skipped" in ledger else \
        np.zeros(len(ledger), bool)
    return int((~skipped[index]).sum()), int(steps[index.min()])


def _casts(run: RunData, main: RankSteps, ops: RankOps | None) -> tuple[float | None, float]:
    """The casts' share of the window's op time and their seconds (None: no op table)."""
    if ops is None or ops.table.empty:
        return None, 0.0
    t = ops.table
    total = float(t["time_s"].sum())
    seconds = float(t.loc[t["op"].isin(CAST_OPS), "time_s"].sum())
    if (ops.roofs is not None and ops.roofs.device == "cuda") or float(t["device_s"].sum()) > 0:
        window = run.rows("window", main.process)
        copies = float(window["transfer_s"].sum()) if "transfer_s" in window else 0.0
        seconds = max(0.0, seconds - copies)
    return (seconds / total if total > 0 else None), seconds


def precision_evidence(run: RunData, ranks: Mapping[int, RankSteps], ledger: pd.DataFrame,
                       ops: Mapping[int, RankOps]) -> dict[int, RankPrecision]:
    """Each rank's mixed precision, where its process recorded any: an autocast, a scaler, a
    loss not finite (the casts alone, with no autocast, are no mixed precision)."""
    out = {}
    for rank, main in sorted(ranks.items()):
        found = rank_precision(run, main, ledger, ops.get(rank))
        if found.autocasts or found.scaler is not None or found.nonfinite:
            out[rank] = found
    return out
