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
from doctor.trace.tables import read_traces


def load_traces(paths: Sequence[str | Path]) -> RunData:
    """The traces at ``paths`` (TraceError, one line, for one that cannot be read), read by
    doctor.trace's one entry point (read_traces), as a run directory's windows are."""
    files = [Path(p) for p in paths]
    procs: list[dict[str, Any]] = []
    status: list[dict[str, Any]] = []
    windows = []
    memory: list[dict[str, Any]] = []
    ops: list[pd.DataFrame] = []
    collectives: list[pd.DataFrame] = []
    for i, (path, trace) in enumerate(zip(files, read_traces(files), strict=True)):
        who = {"node": 0, "rank": trace.rank, "pid": i + 1}
        props = trace.meta.device_properties
        procs.append({**who, "role": "main", "path": str(path),
                      "world_size": trace.meta.world_size,
                      "device_name": str(props[0].get("name")) if props and props[0].get("name")
                      else None})
        memory += [{**who, **row} for row in trace.memory]
        ops.append(trace.ops.assign(**who))
        collectives.append(trace.calls.assign(**who))
        if trace.steps.empty:
            status.append({**who, "ok": False, "reason": trace.no_step_reason})
        else:
            windows.append(trace.steps.assign(node=0, pid=i + 1))
            # an ok trace's reason says what of it was left out (doctor.trace.budget)
            status.append({**who, "ok": True, "reason": trace.cut})
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
