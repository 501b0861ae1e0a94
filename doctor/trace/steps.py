"""The per-step frame of one trace: where each profiled step's time went, host and GPU side.

Steps are the ``ProfilerStep#N`` ranges that ``torch.profiler`` records at each ``prof.step()``.
Without them, steps run from the end of one ``Optimizer.step#...`` annotation to the end of the
next; without those either, the whole trace is one step (``boundary`` says which).

Window arithmetic uses the host step range: GPU work is counted in the step whose window it runs
in, which is what the step's wall time is made of.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from doctor.trace import kinds as ev
from doctor.trace.comm_context import outside_comm, with_waits
from doctor.trace.events import EventArrays, Timeline, build_timeline, load_timeline
from doctor.trace.intervals import (
    Spans,
    clip,
    count_starts,
    difference,
    intersection,
    length,
    union,
    union_of,
)
from doctor.trace.shares import EXCLUSIVE_COLUMNS, StepSpans, partition
from doctor.trace.syncs import closing_sync_start, job_syncs, sync_sources

__all__ = ["STEP_COLUMNS", "empty_step_frame", "step_frame_from_timeline", "trace_step_frame"]

#: Columns of the step frame and their dtypes (seconds unless the name says otherwise).
STEP_COLUMNS: dict[str, str] = {
    "rank": "int64",
    "step": "int64",
    "boundary": "object",  # profiler_step | optimizer_step | whole_trace
    "device": "object",  # cuda | cpu
    "start_us": "float64",  # trace clock
    "dur_s": "float64",
    "dataloader_s": "float64",
    "cpu_op_s": "float64",
    "gpu_busy_s": "float64",
    "gpu_idle_s": "float64",  # NaN on a CPU trace
    "gpu_idle_input_s": "float64",  # GPU idle while the host waits for the DataLoader
    "gpu_idle_host_s": "float64",  # GPU idle while the host runs ops (launch/host-bound)
    "kernel_s": "float64",  # union of non-collective kernels
    "kernel_count": "int64",
    "kernel_median_us": "float64",
    "launch_count": "int64",
    "gemm_s": "float64",  # GEMM / convolution kernels, summed
    "gemm_tensor_core_s": "float64",  # the part of gemm_s in Tensor Core kernels
    "htod_s": "float64",
    "htod_bytes": "int64",
    "htod_pageable_count": "int64",
    "htod_pinned_count": "int64",
    "dtoh_pageable_count": "int64",
    "transfer_s": "float64",  # union of host<->device copies
    "transfer_exposed_s": "float64",  # copies not overlapped by any kernel
    "comm_s": "float64",
    "comm_exposed_s": "float64",
    "sync_s": "float64",
    "sync_count": "int64",
    "sync_bubble_s": "float64",  # GPU idle right after host syncs, until work arrives again
    "sync_source": "object",  # op (and Python frame) with most sync time, "" when none
    "gpu_cc": "float64",  # compute capability of GPU 0 from deviceProperties, NaN if unknown
    "gpu_name": "object",
    **{col: "float64" for col in EXCLUSIVE_COLUMNS.values()},
}


def empty_step_frame() -> pd.DataFrame:
    """A step frame with no rows and every column typed."""
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in STEP_COLUMNS.items()})


def trace_step_frame(
    source: str | Path | Timeline | Iterable[dict[str, Any]], rank: int | None = None
) -> pd.DataFrame:
    """One row per step of a trace (a path, a loaded Timeline, or an iterable of events).

    ``rank`` overrides the trace's ``distributedInfo.rank`` (0 when the trace has none).
    """
    if isinstance(source, Timeline):
        timeline = source
    elif isinstance(source, str | Path):
        timeline = load_timeline(source)
    else:
        timeline = build_timeline(source)
    return step_frame_from_timeline(timeline, rank)


def _windows(t: Timeline) -> tuple[str, list[tuple[int, float, float]]]:
    """The steps of the trace, the last one cut where the profiler began to close the window."""
    boundary, windows = _step_windows(t)
    cut = closing_sync_start(t)
    if cut is None:
        return boundary, windows
    return boundary, [(n, lo, min(hi, cut)) for n, lo, hi in windows if lo < cut]


def _step_windows(t: Timeline) -> tuple[str, list[tuple[int, float, float]]]:
    if t.steps:
        return "profiler_step", t.steps
    opt = t.optimizer_steps
    if len(opt) >= 1:
        ends = opt.end
        starts = np.concatenate(([t.first_us], ends[:-1]))
        return "optimizer_step", [
            (i, float(s), float(e)) for i, (s, e) in enumerate(zip(starts, ends, strict=True))
            if e > s
        ]
    if t.last_us > t.first_us:
        return "whole_trace", [(0, t.first_us, t.last_us)]
    return "whole_trace", []


def _spans(arr: EventArrays, mask: npt.NDArray[np.bool_] | None = None) -> Spans:
    if mask is None:
        return union(arr.start, arr.end)
    return union(arr.start[mask], arr.end[mask])


def _bubbles(sync_ends: npt.NDArray[np.float64], gpu_w: Spans, lo: float, hi: float) -> float:
    """GPU idle time from the end of each host sync in the window until the GPU works again."""
    ends = sync_ends[(sync_ends >= lo) & (sync_ends < hi)]
    gs, ge = gpu_w
    if ends.size == 0:
        return 0.0
    busy = (np.searchsorted(gs, ends, side="right") - np.searchsorted(ge, ends, side="right")) > 0
    ends = ends[~busy]
    if ends.size == 0:
        return 0.0
    nxt = np.searchsorted(gs, ends, side="left")
    resume = np.full(ends.shape, hi)
    has_next = nxt < gs.size
    resume[has_next] = gs[nxt[has_next]]
    # several syncs in one idle gap count the gap once: keep the first sync of each gap
    first = np.concatenate(([True], resume[1:] != resume[:-1]))
    return float(np.sum(resume[first] - ends[first]))


def _gpu_info(t: Timeline) -> tuple[float, str]:
    props = t.meta.device_properties
    if not props:
        return float("nan"), ""
    p = props[0]
    name = str(p.get("name", ""))
    major, minor = p.get("computeMajor"), p.get("computeMinor")
    if isinstance(major, int) and isinstance(minor, int) and not isinstance(major, bool):
        return float(f"{major}.{minor}"), name
    return float("nan"), name


def step_frame_from_timeline(t: Timeline, rank: int | None = None) -> pd.DataFrame:
    """The step frame of a loaded :class:`Timeline`."""
    boundary, windows = _windows(t)
    if not windows:
        return empty_step_frame()
    rank_v = rank if rank is not None else (t.meta.rank if t.meta.rank is not None else 0)
    gpu = t.has_gpu
    k, m, rt, ho = t.kernels, t.memcpy, t.runtime, t.host_ops
    kind = k.attrs["kind"]
    m_kind, m_mem = m.attrs["kind"], m.attrs["mem"]
    comm_k = _spans(k, kind == ev.K_COMM)
    compute = union_of(_spans(k, kind != ev.K_COMM), _spans(m, m_kind == ev.DTOD), _spans(t.memset))
    kernels_only = _spans(k, kind != ev.K_COMM)
    copies = _spans(m, m_kind != ev.DTOD)
    htod = _spans(m, m_kind == ev.HTOD)
    all_gpu = union_of(compute, comm_k, copies)
    dataloader = _spans(t.dataloader)
    host = _spans(ho)
    comm_ops = with_waits(t)  # the collectives, and the threads waiting for them
    host_not_comm = outside_comm(ho, with_waits(t, blocking=True))
    host_comm = _spans(comm_ops)
    sync_rt = job_syncs(t)  # the profiler's own closing sync left out
    syncs = _spans(rt, sync_rt)
    launches = rt.start[rt.attrs["kind"] == ev.RT_LAUNCH]
    sync_starts = rt.start[sync_rt]
    sync_ends = np.sort(rt.end[sync_rt])
    compute_k = kind != ev.K_COMM
    k_start_c, k_dur_c = k.start[compute_k], (k.end - k.start)[compute_k]
    gemm = (kind == ev.K_GEMM) | (kind == ev.K_GEMM_TC)
    gemm_start, gemm_dur = k.start[gemm], (k.end - k.start)[gemm]
    gemm_tc = (kind[gemm] == ev.K_GEMM_TC)
    gpu_cc, gpu_name = _gpu_info(t)
    sources = sync_sources(t, windows)

    rows: list[dict[str, Any]] = []
    for number, lo, hi in windows:
        w = (np.array([lo]), np.array([hi]))

        def c(spans: Spans, lo: float = lo, hi: float = hi) -> Spans:
            return clip(spans, lo, hi)

        dl_w, gpu_w = c(dataloader), c(all_gpu)
        comm_w = c(comm_k) if gpu else c(host_comm)
        comm_exposed = (
            difference(comm_w, c(compute)) if gpu else difference(comm_w, c(host_not_comm))
        )
        copies_w = c(copies)
        idle_w = difference(w, gpu_w)
        in_k = (k_start_c >= lo) & (k_start_c < hi)
        in_g = (gemm_start >= lo) & (gemm_start < hi)
        in_m = (m.start >= lo) & (m.start < hi)
        htod_m = in_m & (m_kind == ev.HTOD)
        dur_s = (hi - lo) / 1e6
        parts = partition(StepSpans(
            window=w, gpu_compute=c(compute), gpu_comm=c(comm_k), gpu_copy=copies_w,
            dataloader=dl_w, host_comm=c(host_comm),
            host_ops=c(host), host_ops_not_comm=c(host_not_comm), gpu=gpu,
        ))
        rows.append({
            "rank": rank_v, "step": number, "boundary": boundary,
            "device": "cuda" if gpu else "cpu",
            "start_us": lo + t.origin_us, "dur_s": dur_s,
            "dataloader_s": length(dl_w) / 1e6,
            "cpu_op_s": length(difference(c(host), dl_w)) / 1e6,
            "gpu_busy_s": length(gpu_w) / 1e6,
            "gpu_idle_s": dur_s - length(gpu_w) / 1e6 if gpu else float("nan"),
            "gpu_idle_input_s": length(intersection(idle_w, dl_w)) / 1e6 if gpu else 0.0,
            "gpu_idle_host_s": (
                length(intersection(difference(idle_w, dl_w), c(host))) / 1e6 if gpu else 0.0
            ),
            "kernel_s": length(c(kernels_only)) / 1e6,
            "kernel_count": int(in_k.sum()),
            "kernel_median_us": float(np.median(k_dur_c[in_k])) if in_k.any() else float("nan"),
            "launch_count": count_starts(launches, lo, hi),
            "gemm_s": float(gemm_dur[in_g].sum()) / 1e6,
            "gemm_tensor_core_s": float(gemm_dur[in_g & gemm_tc].sum()) / 1e6,
            "htod_s": length(c(htod)) / 1e6,
            "htod_bytes": int(np.clip(m.attrs["bytes"][htod_m], 0, None).sum()),
            "htod_pageable_count": int((htod_m & (m_mem == ev.PAGEABLE)).sum()),
            "htod_pinned_count": int((htod_m & (m_mem == ev.PINNED)).sum()),
            "dtoh_pageable_count": int(
                (in_m & (m_kind == ev.DTOH) & (m_mem == ev.PAGEABLE)).sum()
            ),
            "transfer_s": length(copies_w) / 1e6,
            "transfer_exposed_s": length(difference(copies_w, c(compute), c(comm_k))) / 1e6,
            "comm_s": length(comm_w) / 1e6,
            "comm_exposed_s": length(comm_exposed) / 1e6,
            "sync_s": length(c(syncs)) / 1e6,
            "sync_count": count_starts(sync_starts, lo, hi),
            "sync_bubble_s": _bubbles(sync_ends, gpu_w, lo, hi) / 1e6,
            "sync_source": sources.get(number, ""),
            "gpu_cc": gpu_cc, "gpu_name": gpu_name,
            **{EXCLUSIVE_COLUMNS[cat]: v for cat, v in parts.items()},
        })
    frame = pd.DataFrame(rows, columns=list(STEP_COLUMNS))
    return frame.astype(STEP_COLUMNS)
