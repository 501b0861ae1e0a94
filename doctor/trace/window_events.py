"""The events of one trace as a timeline draws them: what ran, on which thread or stream, when.

From a :class:`doctor.trace.events.Timeline` (already read for the analysis, so the trace is read
once), the steps, the host ops, the annotations the analysis knows (optimizer steps, DataLoader
``__next__``), the CUDA runtime calls, and the GPU's kernels, copies and memsets, each as a row
with its track (the trace's thread or stream), a kind, a name, and its start and end in
microseconds on the trace's own clock (Kineto stamps events on the Unix clock, from its
``baseTimeNanoseconds``). Bounded: a long window keeps the newest ``cap`` events (every step
kept), and says how many it had.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from doctor.trace.events import Timeline

#: Most events kept from one trace (its newest; every ProfilerStep besides).
EVENT_CAP = 10_000
#: Columns of the window's events (microseconds on the trace's Unix clock).
EVENT_COLUMNS = {"kind": "object", "track": "object", "name": "object",
                 "start_us": "float64", "end_us": "float64"}
STEP, OP, ANNOTATION, RUNTIME, KERNEL, MEMCPY, MEMSET = (
    "step", "op", "annotation", "runtime", "kernel", "memcpy", "memset")
#: Tracks of what the trace does not place on a thread or stream.
STEPS_TRACK, GPU_TRACK = "ProfilerStep", "GPU"


def window_events(timeline: Timeline, cap: int = EVENT_CAP) -> tuple[pd.DataFrame, int]:
    """(the trace's events, newest ``cap`` of them plus every step, as EVENT_COLUMNS; how many
    events it had). The cap is taken on the arrays, before any event gets a name."""
    kinds = ((OP, timeline.host_ops, None), (RUNTIME, timeline.runtime, None),
             (KERNEL, timeline.kernels, None), (MEMCPY, timeline.memcpy, MEMCPY),
             (MEMSET, timeline.memset, MEMSET),
             (ANNOTATION, timeline.optimizer_steps, "Optimizer.step"),
             (ANNOTATION, timeline.dataloader, "DataLoader.__next__"))
    which = np.concatenate([np.full(len(a), i) for i, (_k, a, _l) in enumerate(kinds)])
    index = np.concatenate([np.arange(len(a)) for _k, a, _l in kinds])
    starts = np.concatenate([a.start for _k, a, _l in kinds])
    total = len(starts)
    if total > cap:
        keep = np.sort(np.argpartition(-starts, cap - 1)[:cap])
        which, index = which[keep], index[keep]
    rows: list[tuple[str, str, str, float, float]] = [
        (STEP, STEPS_TRACK, f"ProfilerStep#{n}", s, e) for n, s, e in timeline.steps]
    names, tids = timeline.names, timeline.tids
    for i, (kind, arrays, label) in enumerate(kinds):
        mine = index[which == i]
        tid = arrays.attrs.get("tid")
        name = arrays.attrs.get("name")
        for j in mine.tolist():
            track = _track(kind, _at(tids, tid[j])) if tid is not None else GPU_TRACK
            rows.append((kind, track, label or _at(names, name[j] if name is not None else -1),
                         float(arrays.start[j]), float(arrays.end[j])))
    frame = pd.DataFrame(rows, columns=list(EVENT_COLUMNS)).astype(EVENT_COLUMNS)
    origin = timeline.origin_us + (timeline.meta.base_time_ns or 0) / 1e3
    frame["start_us"] += origin
    frame["end_us"] += origin
    frame = frame.sort_values("start_us", kind="stable").reset_index(drop=True)
    return frame, total + len(timeline.steps)


def _at(values: list[str], code: int) -> str:
    return values[code] if 0 <= code < len(values) else "?"


def _track(kind: str, tid: str) -> str:
    """The track of an event: its thread on the host, its stream on the GPU."""
    if kind in (KERNEL, MEMCPY, MEMSET):
        return tid if tid.lower().startswith("stream") else f"stream {tid}"
    return f"thread {tid}"
