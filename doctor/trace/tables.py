"""The one entry point of doctor.trace: ``read_traces(paths) -> [TraceTables]``, each trace's
tables from one read of it, whichever door it came by.

A run's own profiler window (doctor.store.windows, one trace per process of a run directory)
and traces analysed on their own (doctor.store.traces, ``doctor report some.json.gz``) both read
their traces here, so both get the same frames of the same trace: one row per profiled step
(doctor.trace.steps), per op (doctor.trace.ops), per collective (doctor.trace.comm_calls), the
allocator per step where the trace recorded memory, and, when asked, the events as a timeline
draws them (doctor.trace.window_events). Several traces are read on the machine's cores, a large
one with the bound on what it keeps (doctor.trace.budget); the ranks not given are the traces'
own (``distributedInfo``; missing or repeated ones number the files in order).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from doctor.trace.beside import Beside, fork_available
from doctor.trace.comm_calls import collective_calls
from doctor.trace.events import Timeline, load_timeline, release_freed_memory
from doctor.trace.ops import NESTING_IN_C, op_table
from doctor.trace.reader import TraceMeta
from doctor.trace.scan import AVAILABLE as SCANNER
from doctor.trace.steps import step_frame_from_timeline
from doctor.trace.window_events import window_events

#: Traces smaller than this in all (bytes on disk) are read one after the other: starting the
#: worker processes would cost more than it saves.
PARALLEL_BYTES = 16 << 20
#: A timeline with more host ops and runtime calls than this has its op table and collectives
#: computed in a forked child while this process finds its steps (doctor.trace.beside), where
#: the ops' nesting runs in Python loops (most of a second per million events). With it in C
#: they take 0.2 s of 2 M events, and the child's own memory (40 MB) is not worth it.
BESIDE_EVENTS = 500_000


@dataclass(frozen=True)
class TraceTables:
    """What one trace gives the analysis: one row per profiled step (``steps``, STEP_COLUMNS of
    doctor.trace.steps; empty when none was found), per op (``ops``, doctor.trace.ops), per
    collective (``calls``, doctor.trace.comm_calls), the allocator per profiled step
    (``memory``: memory_rows, without the process's keys), its events on the trace's clock when
    asked (``events``, window_events.EVENT_COLUMNS, with ``events_total`` how many it had before
    the cap; empty otherwise), and ``meta`` (its rank, world, device) and ``cut`` (what the
    budget left out of it, doctor.trace.budget: "" when nothing)."""

    rank: int
    meta: TraceMeta
    steps: pd.DataFrame
    ops: pd.DataFrame
    calls: pd.DataFrame
    memory: list[dict[str, Any]]
    events: pd.DataFrame
    events_total: int
    cut: str
    no_events: bool  # the trace had no event at all (``steps`` is empty then)

    @property
    def no_step_reason(self) -> str:
        """Why ``steps`` is empty: "" when it is not."""
        if not self.steps.empty:
            return ""
        return "the trace has no events" if self.no_events else "no step could be found"


def read_traces(paths: Sequence[str | Path], ranks: Sequence[int] | None = None, *,
                events: bool = False, workers: int | None = None) -> list[TraceTables]:
    """The tables of each trace at ``paths``, in that order (TraceError, one line, for one that
    cannot be read): of rank ``ranks[i]``, or the traces' own ranks (assign_ranks); with
    ``events``, their events too. ``workers``: the cores to read them on (read_timelines;
    default all usable)."""
    files = [Path(p) for p in paths]
    timelines = read_timelines(files, workers)
    given = list(ranks) if ranks is not None else assign_ranks([t.meta for t in timelines])
    return [_tables_of(timeline, rank, events)
            for timeline, rank in zip(timelines, given, strict=True)]


def _tables_of(timeline: Timeline, rank: int, events: bool) -> TraceTables:
    """One timeline's tables. Its op table and collectives are computed in a forked child while
    this process finds the steps when the timeline is large and the ops' nesting runs in Python
    (BESIDE_EVENTS)."""
    tables = Beside(partial(op_and_collective_tables, timeline), fork=not NESTING_IN_C
                    and len(timeline.host_ops) + len(timeline.runtime) > BESIDE_EVENTS)
    frame = step_frame_from_timeline(timeline, rank)
    release_freed_memory()
    memory = memory_rows(timeline)
    ops, calls = tables.result()
    shown, total = window_events(timeline) if events else (pd.DataFrame(), 0)
    return TraceTables(rank=rank, meta=timeline.meta, steps=frame, ops=ops, calls=calls,
                       memory=memory, events=shown, events_total=total,
                       cut=timeline.cut.note() if timeline.cut else "",
                       no_events=timeline.last_us <= 0)


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
    """A timeline's op table and its collectives (freed memory handed back between them)."""
    ops = op_table(timeline)
    release_freed_memory()  # each step's temporaries: a column or two of every event
    return ops, collective_calls(timeline)


GPU_DEVICE_TYPE = 1  # Kineto's device type of CUDA (and of ROCm's HIP) memory


def memory_rows(timeline: Timeline) -> list[dict[str, Any]]:
    """One allocator row per profiled step of the GPU with the most memory events (tag
    ``trace_step``): the least allocated in the step (what stays between steps), the peak, the
    most reserved, and the device's memory from the trace's ``deviceProperties``."""
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
        rows.append({"tag": "trace_step", "step": number, "device": device,
                     "t_ns": (timeline.origin_us + start) * 1e3,
                     "allocated_bytes": float(allocated[lo:hi].min()),
                     "peak_allocated_bytes": float(allocated[lo:hi].max()),
                     "reserved_bytes": float(reserved[lo:hi].max()),
                     "peak_reserved_bytes": float(reserved[lo:hi].max()),
                     "total_bytes": float(total) if isinstance(total, int | float) else None})
    return rows


def assign_ranks(metas: list[TraceMeta]) -> list[int]:
    """The traces' ranks: their own (``distributedInfo``) when each has one and none repeats."""
    ranks = [m.rank for m in metas]
    known = [r for r in ranks if r is not None]
    if len(known) == len(ranks) and len(set(known)) == len(known):
        return [int(r) for r in known]
    return list(range(len(metas)))  # missing or repeated ranks: number the files in order
