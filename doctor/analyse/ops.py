"""Where compute goes, per rank: the ops of its profiler window against the machine's roofline
(doctor.analyse.roofline), the top ones by time with their class and share of the roof, and
the model FLOP utilisation of the window's steps.

The roofs are those doctor run measured on the machine (run.json ``peaks``), else the published
figures of the rank's GPU (its name from NVML, or a trace's ``deviceProperties``); a CPU job
without a measurement, or a GPU nobody published figures for, has its ops by time only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from doctor.analyse.gpus import GpuCounters
from doctor.analyse.roofline import Roofs, classify, measured_roofs, mfu, published_roofs
from doctor.analyse.steps import RankSteps
from doctor.store.rundata import RunData

TOP = 15
SHOWN = ("op", "kind", "dtype", "bound", "calls", "time_s", "share", "flops", "bytes",
         "intensity", "achieved_flops", "achieved_bytes_s", "of_roof", "roof_dtype")


@dataclass(frozen=True)
class RankOps:
    rank: int
    table: pd.DataFrame  # every op, classified where roofs are known, the most time first
    roofs: Roofs | None
    mfu: float | None
    mfu_dtype: str | None
    window_s: float  # the profiled steps' time the ops were taken over

    def top(self, n: int = TOP) -> pd.DataFrame:
        return self.table[[c for c in SHOWN if c in self.table]].head(n)

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "roofs": self.roofs.to_dict() if self.roofs else None,
                "mfu": self.mfu, "mfu_dtype": self.mfu_dtype, "window_s": self.window_s,
                "top": self.top().to_dict(orient="records")}


def _roofs(run: RunData, device: str, gpu_name: str | None) -> Roofs | None:
    peaks = run.record.peaks if isinstance(run.record.peaks, Mapping) else None
    measured = measured_roofs(peaks, device)
    if measured is not None:
        return measured
    return published_roofs(gpu_name) if device == "cuda" else None


def rank_ops(run: RunData, device: str, main: RankSteps, window: pd.DataFrame,
             counters: GpuCounters | None) -> RankOps | None:
    """One rank's ops, or None when its window recorded none."""
    rows = run.rows("ops", main.process)
    if rows.empty:
        return None
    gpu = device == "cuda"
    summary = counters.of_rank(main.rank) if counters is not None else None
    procs = run.processes
    names = procs.loc[(procs["rank"] == main.rank) & procs["device_name"].notna(),
                      "device_name"] if "device_name" in procs else pd.Series(dtype=object)
    gpu_name = summary.name if summary is not None else (str(names.iloc[0]) if len(names)
                                                         else None)
    roofs = _roofs(run, device, gpu_name)
    table = rows.drop(columns=["node", "rank", "pid"]).reset_index(drop=True)
    mine = window[(window["rank"] == main.rank)] if "rank" in window else window
    window_s = float(mine["dur_s"].sum()) if "dur_s" in mine and len(mine) else 0.0
    if roofs is not None:
        table = classify(table, roofs, gpu)
    else:
        table = table.assign(time_s=table["device_s"] if gpu else table["self_s"])
    total = float(table["time_s"].sum())
    table["share"] = table["time_s"] / total if total > 0 else 0.0
    table = table.sort_values("time_s", ascending=False, kind="stable").reset_index(drop=True)
    found = mfu(table, roofs, window_s) if roofs is not None else None
    return RankOps(rank=main.rank, table=table, roofs=roofs, mfu=found[0] if found else None,
                   mfu_dtype=found[1] if found else None, window_s=window_s)


def ops_evidence(run: RunData, device: str, ranks: Mapping[int, RankSteps],
                 window: pd.DataFrame, counters: GpuCounters | None) -> dict[int, RankOps]:
    """Every rank's ops (see the module docstring)."""
    return {rank: found for rank, main in sorted(ranks.items())
            if (found := rank_ops(run, device, main, window, counters)) is not None}
