"""Where compute goes, per rank: the ops of its profiler window against the machine's roofline
(doctor.analyse.roofline), the top ones by time with their class and share of the roof, and
the model FLOP utilisation of the window's steps.

The roofs are those doctor run measured on the machine (run.json ``peaks``), else the published
figures of the rank's GPU (its name from NVML, or a trace's ``deviceProperties``); a CPU job
without a measurement, or a GPU nobody published figures for, has its ops by time only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import pandas as pd

from doctor.analyse.gpus import GpuCounters
from doctor.analyse.roofline import Roofs, classify, measured_roofs, mfu, published_roofs
from doctor.analyse.steps import RankSteps
from doctor.store.rundata import RunData

TOP = 15
SHOWN = ("op", "kind", "dtype", "bound", "calls", "time_s", "share", "flops", "bytes",
         "intensity", "achieved_flops", "achieved_bytes_s", "of_roof", "roof_dtype", "region")


@dataclass(frozen=True)
class RankOps:
    rank: int
    table: pd.DataFrame  # every op, classified where roofs are known, the most time first
    roofs: Roofs | None
    mfu: float | None
    mfu_dtype: str | None
    window_s: float  # the profiled steps' time the ops were taken over
    note: str | None = None  # why the ops have no costs, where they have none

    def top(self, n: int = TOP) -> pd.DataFrame:
        return self.table[[c for c in SHOWN if c in self.table]].head(n)

    @property
    def compiled_share(self) -> float | None:
        """The share of the ops' time that ran inside torch.compile'd regions (the compiled
        graphs, forward and backward: doctor.trace.compiled_regions); None where the window
        saw no compiled region."""
        t = self.table
        if "region" not in t or not (t["region"].fillna("") != "").any():
            return None
        on_device = float(t["device_s"].sum()) > 0
        inside = float(t["compiled_device_s" if on_device else "compiled_self_s"].sum())
        total = float(t["device_s" if on_device else "self_s"].sum())
        return inside / total if total > 0 else None

    def top_by_bound(self) -> dict[str, float]:
        """The top ops' share of the op time by class (compute, memory, launch), the largest
        first; ops with no class left out."""
        by_bound: dict[str, float] = {}
        for row in self.top().to_dict(orient="records"):
            if row.get("bound"):
                by_bound[row["bound"]] = by_bound.get(row["bound"], 0.0) + float(row["share"] or 0)
        return dict(sorted(by_bound.items(), key=lambda kv: -kv[1]))



def _roofs(run: RunData, device: str, gpu_name: str | None) -> Roofs | None:
    peaks = run.record.peaks if isinstance(run.record.peaks, Mapping) else None
    measured = measured_roofs(peaks, device)
    published = published_roofs(gpu_name) if device == "cuda" else None
    if measured is not None:
        return replace(measured, published=published)
    return published


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
    # the part of each op's share spent in an optimizer's step (0 where the trace did not say)
    column = "opt_device_s" if gpu else "opt_self_s"
    opt = table[column].fillna(0.0) if column in table else 0.0
    table["opt_share"] = opt / total if total > 0 else 0.0
    table = table.sort_values("time_s", ascending=False, kind="stable").reset_index(drop=True)
    found = mfu(table, roofs, window_s) if roofs is not None else None
    return RankOps(rank=main.rank, table=table, roofs=roofs, mfu=found[0] if found else None,
                   mfu_dtype=found[1] if found else None, window_s=window_s,
                   note=_no_costs(run, main, table))


def _no_costs(run: RunData, main: RankSteps, table: pd.DataFrame) -> str | None:
    """Why no op has a cost, where none has (None otherwise)."""
    for cost in ("flops", "bytes"):
        if cost in table and bool((pd.to_numeric(table[cost], errors="coerce") > 0).any()):
            return None
    proc = run.rows("processes", main.process)
    shapes = proc["window_shapes"].iloc[0] if "window_shapes" in proc and len(proc) else None
    if shapes is not None and not pd.isna(shapes) and not bool(shapes):
        from doctor.probes.torch_ops import ENV_SHAPES  # a probe module: for this line only

        return (f"the window recorded no input shapes ({ENV_SHAPES}=off): the ops are by time "
                "only, with no FLOPs, bytes or roofline")
    return ("the trace has no input shapes (record_shapes=False): the ops are by time only, "
            "with no FLOPs, bytes or roofline")


def ops_evidence(run: RunData, device: str, ranks: Mapping[int, RankSteps],
                 window: pd.DataFrame, counters: GpuCounters | None) -> dict[int, RankOps]:
    """Every rank's ops (see the module docstring)."""
    return {rank: found for rank, main in sorted(ranks.items())
            if (found := rank_ops(run, device, main, window, counters)) is not None}
