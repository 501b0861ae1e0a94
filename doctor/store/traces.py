"""``load_traces(paths) -> RunData``: torch.profiler traces recorded elsewhere, one per rank.

A trace loads into the same RunData as a run directory, with what a trace has: one process per
file, its profiled steps as the window, nothing sampled from outside and no stacks. Ranks come
from each trace's ``distributedInfo``; missing or repeated ranks number the files in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from doctor.store.rundata import (
    PROCESS_COLUMNS,
    TRACE,
    WINDOW_COLUMNS,
    WINDOW_STATUS_COLUMNS,
    RunData,
    RunRecord,
    empty_frames,
    typed,
)
from doctor.trace.events import load_timeline
from doctor.trace.reader import TraceMeta
from doctor.trace.steps import step_frame_from_timeline


def load_traces(paths: Sequence[str | Path]) -> RunData:
    """The traces at ``paths`` (TraceError, one line, for one that cannot be read)."""
    files = [Path(p) for p in paths]
    timelines = [load_timeline(p) for p in files]
    ranks = _assign_ranks([t.meta for t in timelines])
    procs: list[dict[str, Any]] = []
    status: list[dict[str, Any]] = []
    windows = []
    for i, (path, timeline, rank) in enumerate(zip(files, timelines, ranks, strict=True)):
        who = {"node": 0, "rank": rank, "pid": i + 1}
        procs.append({**who, "role": "main", "path": str(path),
                      "world_size": timeline.meta.world_size})
        frame = step_frame_from_timeline(timeline, rank)
        if frame.empty:
            why = "the trace has no events" if timeline.last_us <= 0 else "no step could be found"
            status.append({**who, "ok": False, "reason": why})
        else:
            windows.append(frame.assign(node=0, pid=i + 1))
            status.append({**who, "ok": True, "reason": ""})
    frames = empty_frames()
    if windows:
        frames["window"] = typed(pd.concat(windows, ignore_index=True), WINDOW_COLUMNS)
    frames["processes"] = typed(procs, PROCESS_COLUMNS)
    frames["window_status"] = typed(status, WINDOW_STATUS_COLUMNS)
    return RunData(record=RunRecord(kind=TRACE, source=", ".join(str(p) for p in files)),
                   **frames)


def _assign_ranks(metas: list[TraceMeta]) -> list[int]:
    ranks = [m.rank for m in metas]
    known = [r for r in ranks if r is not None]
    if len(known) == len(ranks) and len(set(known)) == len(known):
        return [int(r) for r in known]
    return list(range(len(metas)))  # missing or repeated ranks: number the files in order
