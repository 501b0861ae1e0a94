"""Where host synchronisations come from: the op (and Python frame, when recorded) around each.

A ``cudaStreamSynchronize`` inside ``aten::item`` or ``aten::_local_scalar_dense`` is a ``.item()``
or a Python ``float(tensor)``; one inside ``aten::copy_``/``aten::to`` is a blocking copy to the
host. Traces recorded with ``with_stack=True`` also carry ``python_function`` ranges, which name the
user's line.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from doctor.trace import kinds as ev
from doctor.trace.events import EventArrays, Timeline

__all__ = ["closing_sync_start", "job_syncs", "sync_sources"]

#: At most this many (the longest) sync calls per step are attributed; the rest are alike.
MAX_PER_STEP = 50
_LIBRARY_FRAMES = ("torch/", "site-packages", "dist-packages", "<built-in", "threading.py")


def _innermost(
    arr: EventArrays, names: list[str], tid: int, lo: float, start: float, end: float,
    library_ok: bool,
) -> str:
    """Name of the innermost range on ``tid`` enclosing ``[start, end]`` ('' if none)."""
    if len(arr) == 0:
        return ""
    i0 = int(np.searchsorted(arr.start, lo, side="left"))
    i1 = int(np.searchsorted(arr.start, start, side="right"))
    if i1 <= i0:
        return ""
    s, e = arr.start[i0:i1], arr.end[i0:i1]
    ok = (e >= end) & (arr.attrs["tid"][i0:i1] == tid)
    if not library_ok:
        ok &= np.array([
            not any(p in names[n] for p in _LIBRARY_FRAMES) for n in arr.attrs["name"][i0:i1]
        ], dtype=bool)
    idx = np.flatnonzero(ok)
    if idx.size == 0:
        return ""
    best = idx[np.lexsort((e[idx], -s[idx]))[0]]  # latest start, then earliest end
    return names[int(arr.attrs["name"][i0 + best])]


def job_syncs(t: Timeline) -> np.ndarray:
    """Which runtime calls are the job's host syncs: every sync but those after which the GPU
    starts no more work in the trace. Those are the profiler's own (stopping, it synchronises
    the device to flush its records, inside whatever op the window closed in), and the GPU's
    idle after them is the window's end, not a queue the job drained. (A job's own sync in the
    last moment of the window goes with them: what it cost cannot be seen either.)"""
    rt = t.runtime
    is_sync = rt.attrs["kind"] == ev.RT_SYNC
    starts = [a.start for a in (t.kernels, t.memcpy, t.memset) if len(a)]
    if not starts or not is_sync.any():
        return is_sync
    last_start = max(float(np.max(s)) for s in starts)
    return is_sync & (rt.end <= last_start)


def closing_sync_start(t: Timeline) -> float | None:
    """When the profiler began to close the window (its own device sync; None: none seen). The
    step it closed in ends there: what follows is doctor stopping the profiler, not the job."""
    rt = t.runtime
    closing = (rt.attrs["kind"] == ev.RT_SYNC) & ~job_syncs(t)
    return float(np.min(rt.start[closing])) if closing.any() else None


def sync_sources(t: Timeline, windows: list[tuple[int, float, float]]) -> dict[int, str]:
    """For each step number, the source of most host-sync time: 'call in op (python frame)'."""
    rt = t.runtime
    if len(rt) == 0:
        return {}
    is_sync = job_syncs(t)
    if not is_sync.any():
        return {}
    out: dict[int, str] = {}
    for number, lo, hi in windows:
        idx = np.flatnonzero(is_sync & (rt.start >= lo) & (rt.start < hi))
        if idx.size == 0:
            continue
        durs = rt.end[idx] - rt.start[idx]
        idx = idx[np.argsort(-durs, kind="stable")[:MAX_PER_STEP]]
        totals: dict[str, float] = defaultdict(float)
        for i in idx:
            start, end = float(rt.start[i]), float(rt.end[i])
            tid = int(rt.attrs["tid"][i])
            call = t.names[int(rt.attrs["name"][i])]
            op = _innermost(t.host_ops, t.names, tid, lo, start, end, library_ok=True)
            frame = _innermost(t.python, t.names, tid, lo, start, end, library_ok=False)
            label = call + (f" in {op}" if op else "") + (f" ({frame})" if frame else "")
            totals[label] += end - start
        out[number] = max(totals.items(), key=lambda kv: kv[1])[0]
    return out
