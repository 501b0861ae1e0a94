"""The per-trace tables doctor.store builds a trace's RunData from: several traces read on the
machine's cores (read_timelines), a trace's op table and collectives, its allocator per step, and
the ranks of the traces from their ``distributedInfo``."""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from doctor.trace.beside import fork_available
from doctor.trace.comm_calls import collective_calls
from doctor.trace.events import Timeline, load_timeline, release_freed_memory
from doctor.trace.ops import op_table
from doctor.trace.reader import TraceMeta
from doctor.trace.scan import AVAILABLE as SCANNER

#: Traces smaller than this in all (bytes on disk) are read one after the other: starting the
#: worker processes would cost more than it saves.
PARALLEL_BYTES = 16 << 20
#: A timeline with more host ops and runtime calls than this has its op table and collectives
#: computed in a forked child while this process finds its steps (doctor.trace.beside), where
#: the ops' nesting runs in Python loops (most of a second per million events). With it in C
#: they take 0.2 s of 2 M events, and the child's own memory (40 MB) is not worth it.
BESIDE_EVENTS = 500_000


def read_timelines(files: Sequence[Path], workers: int | None = None) -> list[Timeline]:
    """Each trace's timeline, in the order given, read on the machine's cores when they are
    large enough to be worth it: several traces one process each; one trace its blocks across
    processes (doctor.trace.parallel) where the C scanner is missing (doctor.trace.scan)."""
    from doctor.machine import usable_cores

    cores = workers or usable_cores()
    size = sum(p.stat().st_size for p in files if p.is_file())
    if cores < 2 or size < PARALLEL_BYTES or multiprocessing.current_process().daemon or (
            len(files) == 1 and SCANNER):
        # (a daemonic process, such as a pool's worker, may not start processes of its own;
        # the C scanner reads one trace on two cores by itself: gunzip beside the scan)
        return [load_timeline(p) for p in files]
    if len(files) == 1:
        from doctor.trace.parallel import load_timeline_parallel

        return [load_timeline_parallel(files[0], cores)]
    workers = min(len(files), cores)
    context = multiprocessing.get_context("fork" if fork_available() else "spawn")
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        return list(pool.map(load_timeline, files))


def op_and_collective_tables(timeline: Timeline) -> tuple[pd.DataFrame, pd.DataFrame]:
    ops = op_table(timeline)
    release_freed_memory()  # each step's temporaries: a column or two of every event
    return ops, collective_calls(timeline)


GPU_DEVICE_TYPE = 1  # Kineto's device type of CUDA (and of ROCm's HIP) memory


def memory_rows(timeline: Timeline, who: dict[str, Any]) -> list[dict[str, Any]]:
    """One allocator row per profiled step of the GPU with the most memory events."""
    mem = timeline.memory
    gpu = mem.attrs["device_type"] == GPU_DEVICE_TYPE if len(mem) else np.zeros(0, bool)
    if not gpu.any():
        return []
    devices = mem.attrs["device"][gpu]
    device = int(np.bincount(devices - devices.min()).argmax() + devices.min())
    mine = gpu & (mem.attrs["device"] == device)
    ts, allocated, reserved = (mem.start[mine], mem.attrs["allocated"][mine],
                               mem.attrs["reserved"][mine])
    total = next((p.get("totalGlobalMem") for p in timeline.meta.device_properties
                  if p.get("id") == device), None)
    rows = []
    for number, start, end in timeline.steps:
        lo, hi = np.searchsorted(ts, [start, end], side="left")
        if hi <= lo:
            continue
        rows.append({**who, "tag": "trace_step", "step": number, "device": device,
                     "t_ns": (timeline.origin_us + start) * 1e3,
                     "allocated_bytes": float(allocated[lo:hi].min()),
                     "peak_allocated_bytes": float(allocated[lo:hi].max()),
                     "reserved_bytes": float(reserved[lo:hi].max()),
                     "peak_reserved_bytes": float(reserved[lo:hi].max()),
                     "total_bytes": float(total) if isinstance(total, int | float) else None})
    return rows


def assign_ranks(metas: list[TraceMeta]) -> list[int]:
    ranks = [m.rank for m in metas]
    known = [r for r in ranks if r is not None]
    if len(known) == len(ranks) and len(set(known)) == len(known):
        return [int(r) for r in known]
    return list(range(len(metas)))  # missing or repeated ranks: number the files in order
