"""Samples on disk: host and GPU samples from the parent (``host.npz``, ``gpu.npz``) and CUDA
allocator snapshots from the job (``memory.jsonl`` in each process folder).

Samplers keep flat arrays of floats (one per column) and hand them here whole; readers turn them
into frames with units in their column names. A missing file reads as an empty frame with every
column, so that stages downstream never test for absence column by column.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

from doctor.store.layout import GPU, GPU_INFO, HOST, MEMORY, OTHERS

from .safe_files import open_new, write_text_atomic

#: Per process of the job, per tick (``cpu_pct`` is derived on load). ``run_delay_s`` and
#: ``on_cpu_s`` are its main thread's (schedstat: runnable without a core, on a core).
#: doctor run's rate: the host and the GPUs at 2 Hz (the lead may change it, issue 32 item 11).
SAMPLE_INTERVAL_S = 0.5
#: ``read_bytes``: read from storage; ``read_count``/``read_chars``: read calls and the bytes
#: they returned, the page cache's included (the kernel's per-process io counters)
PROC_COLUMNS = ("t_s", "pid", "ppid", "cpu_s", "rss_bytes", "read_bytes", "threads",
                "run_delay_s", "private_bytes", "comm_cpu_s", "on_cpu_s", "read_count",
                "read_chars")
#: The machine, per tick.
SYSTEM_COLUMNS = ("t_s", "cores", "runnable", "busy_cores", "iowait_cores")
#: Per GPU, per tick (the ``gpm_*`` columns are NaN where the GPU has no GPM metrics).
GPU_COLUMNS = ("t_s", "gpu", "util_pct", "mem_util_pct", "mem_used_bytes", "mem_total_bytes",
               "pcie_tx_kbps", "pcie_rx_kbps", "sm_clock_mhz", "power_w", "throttle_reasons",
               "temp_c", "gpm_sm_active_pct", "gpm_tensor_active_pct", "gpm_dram_bw_pct")
#: The processes each GPU runs, per rescan (any process of the machine; pids as NVML sees them).
GPU_PROC_COLUMNS = ("t_s", "gpu", "pid", "used_bytes")
#: A process outside the job that took cores between two scans (doctor.probes.others).
OTHER_COLUMNS = ("t0_s", "t1_s", "pid", "cores")
#: One CUDA allocator snapshot (``pid`` and ``t_s`` are added on load).
MEMORY_COLUMNS = ("t_ns", "tag", "device", "allocated_bytes", "reserved_bytes",
                  "inactive_split_bytes", "alloc_retries", "num_ooms", "peak_reserved_bytes",
                  "peak_allocated_bytes", "step", "total_bytes")

Columns = Mapping[str, Any]  # column name -> a buffer of float64 (array.array("d"), ndarray)


# pandas is imported where frames are built (report time): the doctor run process that saves
# samples while the job runs never loads it (~0.5 s of a core, taken from the job's start).


def _empty(columns: Iterable[str]) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame({c: pd.Series(dtype="float64") for c in columns})


def save_host(run_dir: Path, procs: Columns, system: Columns) -> None:
    arrays: dict[str, Any] = {
        **{f"proc_{c}": np.frombuffer(procs[c], dtype=np.float64) for c in PROC_COLUMNS},
        **{f"system_{c}": np.frombuffer(system[c], dtype=np.float64) for c in SYSTEM_COLUMNS}}
    with open_new(run_dir / HOST) as f:  # whole or absent, never half (a full disk)
        np.savez_compressed(f, **arrays)


def save_others(run_dir: Path, rows: list[dict[str, Any]]) -> None:
    """The processes outside the job that took cores (``others.json``; none: no file)."""
    if rows:
        write_text_atomic(run_dir / OTHERS, json.dumps(rows))


def read_others(run_dir: Path, problems: list[str] | None = None) -> pd.DataFrame:
    """The processes outside the job that took cores, one row per process and scan
    (OTHER_COLUMNS and ``name``); empty when not recorded, or unreadable (said)."""
    import pandas as pd

    from .readback import Unreadable, as_float, as_int, as_str, printable, read_json

    empty = _empty(OTHER_COLUMNS).assign(name=pd.Series(dtype=object))
    if not os.path.lexists(run_dir / OTHERS):
        return empty
    try:
        rows = read_json(run_dir / OTHERS)
    except Unreadable as err:
        _say(problems, str(err))
        return empty
    kept = []
    for row in rows if isinstance(rows, list) else []:
        if not isinstance(row, dict):
            continue
        values = [as_float(row.get(c)) for c in ("t0_s", "t1_s", "cores")]
        pid, name = as_int(row.get("pid")), as_str(row.get("name"))
        if any(v is None for v in values) or pid is None or name is None:
            continue
        kept.append({"t0_s": values[0], "t1_s": values[1], "pid": float(pid),
                     "cores": values[2], "name": printable(name[:64])})
    return pd.DataFrame(kept) if kept else empty


def read_host(run_dir: Path, problems: list[str] | None = None
              ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-process samples with cpu_pct, machine samples); empty frames when absent, or when
    the file cannot be read (said in ``problems``)."""
    empty = _empty((*PROC_COLUMNS, "cpu_pct")), _empty(SYSTEM_COLUMNS)
    z = _arrays(run_dir / HOST, problems)
    if z is None:
        return empty
    procs = _frame(z, PROC_COLUMNS, "proc_", required=("t_s", "pid", "ppid", "cpu_s"))
    system = _frame(z, SYSTEM_COLUMNS, "system_", required=SYSTEM_COLUMNS)
    if procs is None or system is None:
        _say(problems, f"{run_dir / HOST}: its columns are missing or of unequal lengths")
        return empty
    finite = np.isfinite(procs["pid"]) & np.isfinite(procs["ppid"])
    procs = procs[finite]
    procs["pid"] = procs["pid"].astype("int64")
    procs["ppid"] = procs["ppid"].astype("int64")
    procs = procs.sort_values(["pid", "t_s"]).reset_index(drop=True)
    dt = procs.groupby("pid")["t_s"].diff()
    dcpu = procs.groupby("pid")["cpu_s"].diff()
    procs["cpu_pct"] = (dcpu / dt * 100.0).where(dt > 0)
    return procs, system


def _say(problems: list[str] | None, line: str) -> None:
    if problems is not None:
        problems.append(f"{line}: left out")


def _arrays(path: Path, problems: list[str] | None) -> dict[str, Any] | None:
    """The arrays of a samples file; None when there is none, or it cannot be read (said)."""
    from .readback import Unreadable, load_arrays

    if not os.path.lexists(path):
        return None
    try:
        return load_arrays(path)
    except Unreadable as err:
        _say(problems, str(err))
        return None


def _frame(z: Mapping[str, Any], columns: Iterable[str], prefix: str = "",
           required: Iterable[str] = ()) -> pd.DataFrame | None:
    import pandas as pd

    """The columns of ``z`` (``prefix`` + name) as a float frame, a column it lacks as NaN;
    None when a ``required`` column is missing or the columns' lengths differ."""
    if any(f"{prefix}{c}" not in z for c in required):
        return None
    present = [z[f"{prefix}{c}"] for c in columns if f"{prefix}{c}" in z]
    n = len(present[0]) if present else 0
    if any(len(a) != n for a in present):
        return None
    return pd.DataFrame({c: z[f"{prefix}{c}"].astype(np.float64) if f"{prefix}{c}" in z
                         else np.full(n, np.nan) for c in columns})


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


def read_gpu(run_dir: Path, problems: list[str] | None = None) -> pd.DataFrame:
    """The per-GPU samples; columns a run of an older doctor did not record read as NaN (a file
    that cannot be read: none, said in ``problems``)."""
    z = _arrays(run_dir / GPU, problems)
    frame = _frame(z, GPU_COLUMNS, required=("t_s", "gpu")) if z is not None else None
    if frame is None:
        if z is not None:
            _say(problems, f"{run_dir / GPU}: its GPU columns are missing or of unequal lengths")
        return _empty(GPU_COLUMNS)
    frame = frame[np.isfinite(frame["gpu"])]
    frame["gpu"] = frame["gpu"].astype("int64")
    return frame


def read_gpu_procs(run_dir: Path) -> pd.DataFrame:
    """Which processes ran on which GPU, per rescan; empty when not recorded (or unreadable:
    read_gpu says so)."""
    z = _arrays(run_dir / GPU, None)
    frame = _frame(z, GPU_PROC_COLUMNS, "proc_", required=GPU_PROC_COLUMNS) if z else None
    if frame is None:
        return _empty(GPU_PROC_COLUMNS)
    frame = frame[np.isfinite(frame["gpu"]) & np.isfinite(frame["pid"])]
    for c in ("gpu", "pid"):
        frame[c] = frame[c].astype("int64")
    return frame


def read_gpu_info(run_dir: Path) -> list[dict[str, Any]]:
    """What each GPU of the node is (``gpus.json``), index order; [] when not recorded (or not
    readable)."""
    from .readback import Unreadable, read_json

    try:
        info = read_json(run_dir / GPU_INFO)
    except (Unreadable, FileNotFoundError):
        return []
    return [g for g in info if isinstance(g, dict)] if isinstance(info, list) else []


def read_memory(proc_dirs: Mapping[int, Path], problems: list[str] | None = None
                ) -> pd.DataFrame:
    """Every snapshot the process folders (pid -> folder) hold, with ``pid`` and ``t_s`` (from
    the first snapshot); an empty frame when none."""
    import pandas as pd

    from .readback import Unreadable, as_float, read_text

    rows: list[dict[str, Any]] = []
    for pid, d in proc_dirs.items():
        path = d / MEMORY
        if not os.path.lexists(path):
            continue
        try:
            text = read_text(path)
        except Unreadable as err:
            _say(problems, str(err))
            continue
        for line in text.splitlines():
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):
                continue  # a line cut short by a kill
            if isinstance(row, dict):
                rows.append({**row, "pid": pid})
    if not rows:
        return _empty((*MEMORY_COLUMNS, "pid", "t_s"))
    rows = [r for r in rows if as_float(r.get("t_ns")) is not None]  # a time, or no snapshot
    if not rows:
        return _empty((*MEMORY_COLUMNS, "pid", "t_s"))
    frame = pd.DataFrame(rows)
    frame["t_ns"] = frame["t_ns"].astype(np.float64)
    frame["t_s"] = (frame["t_ns"] - frame["t_ns"].min()) * 1e-9
    return frame
