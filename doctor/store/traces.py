"""``load_traces(paths) -> RunData``: torch.profiler traces recorded elsewhere, one per rank.

A trace loads into the same RunData as a run directory, with what a trace has: one process per
file, its profiled steps as the window, nothing sampled from outside and no stacks. Ranks come
from each trace's ``distributedInfo``; missing or repeated ranks number the files in order. A
trace recorded with ``profile_memory=True`` gives the allocator per step (the memory frame, tag
``trace_step``): the least allocated in the step (what stays between steps), the peak, the most
reserved, and the device's memory from the trace's ``deviceProperties``.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

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
from doctor.trace.beside import Beside
from doctor.trace.events import release_freed_memory
from doctor.trace.ops import NESTING_IN_C
from doctor.trace.steps import step_frame_from_timeline
from doctor.trace.tables import (
    BESIDE_EVENTS,
    assign_ranks,
    memory_rows,
    op_and_collective_tables,
    read_timelines,
)


def load_traces(paths: Sequence[str | Path]) -> RunData:
    """The traces at ``paths`` (TraceError, one line, for one that cannot be read)."""
    files = [Path(p) for p in paths]
    timelines = read_timelines(files)
    ranks = assign_ranks([t.meta for t in timelines])
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
        tables = Beside(partial(op_and_collective_tables, timeline), fork=not NESTING_IN_C
                        and len(timeline.host_ops) + len(timeline.runtime) > BESIDE_EVENTS)
        frame = step_frame_from_timeline(timeline, rank)
        release_freed_memory()
        memory += memory_rows(timeline, who)
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
