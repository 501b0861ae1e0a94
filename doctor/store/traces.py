"""``load_traces(paths) -> RunData``: torch.profiler traces recorded elsewhere, one per rank.

A trace loads into the same RunData as a run directory, with what a trace has: one process per
file, its profiled steps as the window, nothing sampled from outside and no stacks. Ranks come
from each trace's ``distributedInfo``; missing or repeated ranks number the files in order. A
trace recorded with ``profile_memory=True`` gives the allocator per step (the memory frame, tag
``trace_step``): the least allocated in the step (what stays between steps), the peak, the most
reserved, and the device's memory from the trace's ``deviceProperties``.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from doctor.store.rundata import (
    FRAME_COLUMNS,
    PROCESS_COLUMNS,
    TRACE,
    WINDOW_COLUMNS,
    WINDOW_STATUS_COLUMNS,
    RunData,
    RunRecord,
    empty_frames,
    typed,
)
from doctor.trace.beside import Beside, fork_available
from doctor.trace.comm_calls import collective_calls
from doctor.trace.events import Timeline, load_timeline, release_freed_memory
from doctor.trace.ops import NESTING_IN_C, op_table
from doctor.trace.reader import TraceMeta
from doctor.trace.scan import AVAILABLE as SCANNER
from doctor.trace.steps import step_frame_from_timeline

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


def load_traces(paths: Sequence[str | Path]) -> RunData:
    """The traces at ``paths`` (TraceError, one line, for one that cannot be read)."""
    files = [Path(p) for p in paths]
    timelines = read_timelines(files)
    ranks = _assign_ranks([t.meta for t in timelines])
    procs: list[dict[str, Any]] = []
    status: list[dict[str, Any]] = []
    windows = []
    memory: list[dict[str, Any]] = []
    ops: list[pd.DataFrame] = []
    collectives: list[pd.DataFrame] = []
    for i, (path, timeline, rank) in enumerate(zip(files, timelines, ranks, strict=True)):
        who = {"node": 0, "rank": rank, "pid": i + 1}
        props = timeline.meta.device_properties
        procs.append({**who, "role": "main", "path": str(path),
                      "world_size": timeline.meta.world_size,
                      "device_name": str(props[0].get("name")) if props and props[0].get("name")
                      else None})
        tables = Beside(partial(_op_and_collective_tables, timeline), fork=not NESTING_IN_C
                        and len(timeline.host_ops) + len(timeline.runtime) > BESIDE_EVENTS)
        frame = step_frame_from_timeline(timeline, rank)
        release_freed_memory()
        memory += _memory_rows(timeline, who)
        op_rows, collective_rows = tables.result()
        ops.append(op_rows.assign(**who))
        collectives.append(collective_rows.assign(**who))
        if frame.empty:
            why = "the trace has no events" if timeline.last_us <= 0 else "no step could be found"
            status.append({**who, "ok": False, "reason": why})
        else:
            windows.append(frame.assign(node=0, pid=i + 1))
            # an ok trace's reason says what of it was left out (doctor.trace.budget)
            status.append({**who, "ok": True,
                           "reason": timeline.cut.note() if timeline.cut else ""})
    frames = empty_frames()
    if windows:
        frames["window"] = typed(pd.concat(windows, ignore_index=True), WINDOW_COLUMNS)
    frames["processes"] = typed(procs, PROCESS_COLUMNS)
    frames["window_status"] = typed(status, WINDOW_STATUS_COLUMNS)
    if memory:
        frames["memory"] = typed(memory, FRAME_COLUMNS["memory"])
    if ops:
        frames["ops"] = typed(pd.concat(ops, ignore_index=True), FRAME_COLUMNS["ops"])
    if collectives:
        frames["collectives"] = typed(pd.concat(collectives, ignore_index=True),
                                      FRAME_COLUMNS["collectives"])
    return RunData(record=RunRecord(kind=TRACE, sources=tuple(str(p) for p in files)),
                   **frames)


def _op_and_collective_tables(timeline: Timeline) -> tuple[pd.DataFrame, pd.DataFrame]:
    ops = op_table(timeline)
    release_freed_memory()  # each step's temporaries: a column or two of every event
    return ops, collective_calls(timeline)


GPU_DEVICE_TYPE = 1  # Kineto's device type of CUDA (and of ROCm's HIP) memory


def _memory_rows(timeline: Timeline, who: dict[str, Any]) -> list[dict[str, Any]]:
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


def _assign_ranks(metas: list[TraceMeta]) -> list[int]:
    ranks = [m.rank for m in metas]
    known = [r for r in ranks if r is not None]
    if len(known) == len(ranks) and len(set(known)) == len(known):
        return [int(r) for r in known]
    return list(range(len(metas)))  # missing or repeated ranks: number the files in order
