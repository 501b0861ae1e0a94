"""The tables a report shows beside the verdict: per rank, per process, the loaders, where the
loading time went by function, and the profiled steps. Each is a frame, or absent when empty."""

from __future__ import annotations

import numpy as np
import pandas as pd

from doctor.analyse.distributed import rank_table
from doctor.analyse.memory import KINDS as MEMORY_KINDS
from doctor.analyse.memory import MemoryEvidence
from doctor.analyse.split import OutsideShares, StageSplit, top_functions
from doctor.store.process_rows import process_labels


def report_tables(ledger: pd.DataFrame, window: pd.DataFrame, loaders: pd.DataFrame,
                  host: pd.DataFrame, processes: pd.DataFrame,
                  splits: dict[int, StageSplit], outside: dict[int, OutsideShares]
                  ) -> dict[str, pd.DataFrame]:
    tables = {
        "top_functions": top_functions(splits, outside),
        "ranks": rank_table(ledger, window),
        "loaders": loaders,
        "processes": process_table(host, processes),
        "gpu_steps": window.drop(columns=["node", "pid"], errors="ignore"),
    }
    return {name: frame for name, frame in tables.items() if not frame.empty}


def process_table(host: pd.DataFrame, processes: pd.DataFrame) -> pd.DataFrame:
    """CPU, memory and reads of each process the parent sampled."""
    if host.empty:
        return pd.DataFrame()
    roles = process_labels(processes)
    g = host.groupby(["node", "pid"])
    table = pd.DataFrame({
        "cpu_pct_mean": g["cpu_pct"].mean(),
        "cpu_pct_max": g["cpu_pct"].max(),
        "rss_mb_max": g["rss_bytes"].max() / 2**20,
        "read_mb": (g["read_bytes"].max() - g["read_bytes"].min()) / 2**20,
        "threads_max": g["threads"].max(),
    }).reset_index()
    table.insert(2, "process", [roles.get((int(n), int(p)), "other")
                                for n, p in zip(table["node"], table["pid"], strict=True)])
    if table["node"].nunique() == 1:
        table = table.drop(columns=["node"])
    return table.replace({np.nan: None}).round(1)


def memory_tables(memory: MemoryEvidence | None) -> dict[str, pd.DataFrame]:
    """The breakdown per rank ("memory"; ``between_steps_bytes``: what stays allocated between
    steps beyond the model's measured state, e.g. a trace's parameters, gradients, optimizer
    state and communication buckets together) and each rank's memory over the run
    ("memory_over_run": seconds, bytes used, bytes reserved on a GPU, the capacity)."""
    if memory is None or not memory.ranks:
        return {}
    ranks = memory.ranks.values()
    breakdown = pd.DataFrame([{
        "rank": m.rank, "device": m.device,
        **{f"{k}_bytes": m.parts.get(k) for k in MEMORY_KINDS},
        "between_steps_bytes": max(m.resident_bytes - m.static_bytes, 0.0)
        if m.resident_bytes is not None else None,
        "reserved_peak_bytes": m.allocator.get("reserved_peak_bytes"),
        "peak_bytes": m.peak_bytes, "capacity_bytes": m.capacity_bytes,
        "headroom_bytes": m.headroom_bytes,
        "growth_per_step_bytes": m.growth.bytes_per_step if m.growth else None,
    } for m in ranks]).dropna(axis=1, how="all")
    over = pd.DataFrame([{"rank": m.rank, "t_s": t, "used_bytes": used,
                          "reserved_bytes": reserved, "capacity_bytes": m.capacity_bytes}
                         for m in ranks for t, used, reserved in m.over_run])
    return {"memory": breakdown, **({"memory_over_run": over} if not over.empty else {})}
