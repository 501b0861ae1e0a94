"""Samples on disk: host and GPU samples from the parent (``host.npz``, ``gpu.npz``) and CUDA
allocator snapshots from the job (``memory.jsonl`` in each process folder).

Samplers keep flat arrays of floats (one per column) and hand them here whole; readers turn them
into frames with units in their column names. A missing file reads as an empty frame with every
column, so that stages downstream never test for absence column by column.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from doctor.store.layout import GPU, GPU_INFO, HOST, MEMORY

from .safe_files import open_new, write_text_atomic

#: Per process of the job, per tick (``cpu_pct`` is derived on load).
PROC_COLUMNS = ("t_s", "pid", "ppid", "cpu_s", "rss_bytes", "read_bytes", "threads",
                "run_delay_s", "private_bytes", "comm_cpu_s")
#: The machine, per tick.
SYSTEM_COLUMNS = ("t_s", "cores", "runnable", "busy_cores", "iowait_cores")
#: Per GPU, per tick (the ``gpm_*`` columns are NaN where the GPU has no GPM metrics).
GPU_COLUMNS = ("t_s", "gpu", "util_pct", "mem_util_pct", "mem_used_bytes", "mem_total_bytes",
               "pcie_tx_kbps", "pcie_rx_kbps", "sm_clock_mhz", "power_w", "throttle_reasons",
               "temp_c", "gpm_sm_active_pct", "gpm_tensor_active_pct", "gpm_dram_bw_pct")
#: The processes each GPU runs, per rescan (any process of the machine; pids as NVML sees them).
GPU_PROC_COLUMNS = ("t_s", "gpu", "pid", "used_bytes")
#: One CUDA allocator snapshot (``pid`` and ``t_s`` are added on load).
MEMORY_COLUMNS = ("t_ns", "tag", "device", "allocated_bytes", "reserved_bytes",
                  "inactive_split_bytes", "alloc_retries", "num_ooms", "peak_reserved_bytes",
                  "peak_allocated_bytes", "step", "total_bytes")

Columns = Mapping[str, Any]  # column name -> a buffer of float64 (array.array("d"), ndarray)


def _empty(columns: Iterable[str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="float64") for c in columns})


def save_host(run_dir: Path, procs: Columns, system: Columns) -> None:
    arrays: dict[str, Any] = {
        **{f"proc_{c}": np.frombuffer(procs[c], dtype=np.float64) for c in PROC_COLUMNS},
        **{f"system_{c}": np.frombuffer(system[c], dtype=np.float64) for c in SYSTEM_COLUMNS}}
    with open_new(run_dir / HOST) as f:  # whole or absent, never half (a full disk)
        np.savez_compressed(f, **arrays)


def read_host(run_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-process samples with cpu_pct, machine samples); empty frames when absent."""
    path = run_dir / HOST
    if not path.exists():
        return _empty((*PROC_COLUMNS, "cpu_pct")), _empty(SYSTEM_COLUMNS)
    with np.load(path) as z:
        n = len(z["proc_t_s"])
        procs = pd.DataFrame({c: z[f"proc_{c}"] if f"proc_{c}" in z else np.full(n, np.nan)
                              for c in PROC_COLUMNS})
        system = pd.DataFrame({c: z[f"system_{c}"] for c in SYSTEM_COLUMNS})
    procs["pid"] = procs["pid"].astype("int64")
    procs["ppid"] = procs["ppid"].astype("int64")
    procs = procs.sort_values(["pid", "t_s"]).reset_index(drop=True)
    dt = procs.groupby("pid")["t_s"].diff()
    dcpu = procs.groupby("pid")["cpu_s"].diff()
    procs["cpu_pct"] = (dcpu / dt * 100.0).where(dt > 0)
    return procs, system


def save_gpu(run_dir: Path, columns: Columns, procs: Columns | None = None,
             info: list[dict[str, Any]] | None = None) -> None:
    """The samples (``gpu.npz``: per-GPU columns, and ``proc_*`` for the processes on each GPU)
    and what each GPU is (``gpus.json``: name, uuid, limits, whether it has GPM metrics)."""
    if info:
        write_text_atomic(run_dir / GPU_INFO, json.dumps(info, indent=1))
    if len(columns["t_s"]):
        arrays: dict[str, Any] = {c: np.frombuffer(columns[c], dtype=np.float64)
                                  for c in GPU_COLUMNS}
        if procs is not None:
            arrays.update({f"proc_{c}": np.frombuffer(procs[c], dtype=np.float64)
                           for c in GPU_PROC_COLUMNS})
        with open_new(run_dir / GPU) as f:
            np.savez_compressed(f, **arrays)


def read_gpu(run_dir: Path) -> pd.DataFrame:
    """The per-GPU samples; columns a run of an older doctor did not record read as NaN."""
    path = run_dir / GPU
    if not path.exists():
        return _empty(GPU_COLUMNS)
    with np.load(path) as z:
        n = len(z["t_s"])
        frame = pd.DataFrame({c: z[c] if c in z else np.full(n, np.nan) for c in GPU_COLUMNS})
    frame["gpu"] = frame["gpu"].astype("int64")
    return frame


def read_gpu_procs(run_dir: Path) -> pd.DataFrame:
    """Which processes ran on which GPU, per rescan; empty when not recorded."""
    path = run_dir / GPU
    if not path.exists():
        return _empty(GPU_PROC_COLUMNS)
    with np.load(path) as z:
        if "proc_t_s" not in z:
            return _empty(GPU_PROC_COLUMNS)
        frame = pd.DataFrame({c: z[f"proc_{c}"] for c in GPU_PROC_COLUMNS})
    for c in ("gpu", "pid"):
        frame[c] = frame[c].astype("int64")
    return frame


def read_gpu_info(run_dir: Path) -> list[dict[str, Any]]:
    """What each GPU of the node is (``gpus.json``), index order; [] when not recorded."""
    try:
        info = json.loads((run_dir / GPU_INFO).read_text())
    except (OSError, json.JSONDecodeError):
        return []
    return [g for g in info if isinstance(g, dict)] if isinstance(info, list) else []


def read_memory(proc_dirs: Mapping[int, Path]) -> pd.DataFrame:
    """Every snapshot the process folders (pid -> folder) hold, with ``pid`` and ``t_s`` (from
    the first snapshot); an empty frame when none."""
    rows: list[dict[str, Any]] = []
    for pid, d in proc_dirs.items():
        path = d / MEMORY
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            try:
                rows.append({**json.loads(line), "pid": pid})
            except json.JSONDecodeError:
                continue  # a line cut short by a kill
    if not rows:
        return _empty((*MEMORY_COLUMNS, "pid", "t_s"))
    frame = pd.DataFrame(rows)
    frame["t_s"] = (frame["t_ns"] - frame["t_ns"].min()) * 1e-9
    return frame
