"""The ops of a trace, one row per op name: calls, the host's own time in them (time in the ops
they call taken out), the device time of the kernels they launched, and their operations and
bytes (doctor.trace.op_costs, where the trace has shapes).

An op's own host time is its duration less that of the ops nested directly inside it on the same
thread, so a composite (``aten::linear``) and what it calls (``aten::addmm``) add up to the
composite's duration once. A kernel belongs to the host op that launched it: its launch (the
runtime call with the same ``correlation``) falls inside that op, the innermost one on the
launching thread.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from doctor.trace.events import Timeline
from doctor.trace.kinds import K_LAYOUT
from doctor.trace.op_costs import COST_DTYPES, COST_KINDS, LAYOUT_NCHW, LAYOUT_NHWC

US = 1e-6
OP_COLUMNS = ("op", "kind", "dtype", "calls", "self_s", "device_s", "kernels", "flops",
              "bytes", "costed_calls", "layout_s", "nchw_calls", "nhwc_calls")


def _self_us(start: np.ndarray, end: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """Each op's duration less its direct children's on the same thread (events sorted by
    start, as EventArrays are)."""
    own = end - start
    stacks: dict[int, list[int]] = {}
    for i in range(len(start)):
        stack = stacks.setdefault(int(tid[i]), [])
        while stack and end[stack[-1]] <= start[i]:
            stack.pop()
        if stack:
            own[stack[-1]] -= end[i] - start[i]
        stack.append(i)
    return np.maximum(own, 0.0)


def _launching_ops(t: Timeline) -> np.ndarray:
    """For each runtime call, the index of the innermost host op on its thread that contains
    it (-1: none)."""
    host, rt = t.host_ops, t.runtime
    out = np.full(len(rt), -1, dtype=np.int64)
    if not len(host) or not len(rt):
        return out
    by_tid: dict[int, list[int]] = {}
    for i, tid in enumerate(host.attrs["tid"]):
        by_tid.setdefault(int(tid), []).append(i)
    for tid, calls in _group(rt.attrs["tid"]).items():
        ops = by_tid.get(tid, [])
        stack: list[int] = []
        k = 0
        for j in calls:  # runtime calls and host ops both sorted by start
            at = rt.start[j]
            while k < len(ops) and host.start[ops[k]] <= at:
                while stack and host.end[stack[-1]] <= host.start[ops[k]]:
                    stack.pop()
                stack.append(ops[k])
                k += 1
            while stack and host.end[stack[-1]] < at:
                stack.pop()
            if stack:
                out[j] = stack[-1]
    return out


def _group(values: np.ndarray) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for i, v in enumerate(values):
        out.setdefault(int(v), []).append(i)
    return out


def op_table(t: Timeline, lo_us: float | None = None, hi_us: float | None = None
             ) -> pd.DataFrame:
    """One row per op name that started within [lo_us, hi_us) (the whole trace by default),
    the most time first (device time on a GPU trace, the host's own time otherwise). ``device_s``
is the time of the kernels and copies the op launched; ``kernels`` counts both; ``layout_s`` is
    the part of it in NCHW/NHWC transposes; ``nchw_calls`` and ``nhwc_calls`` count the calls of
    a convolution whose input the strides show in that memory format."""
    host, kernels = t.host_ops, t.kernels
    if not len(host):
        return pd.DataFrame({c: pd.Series(dtype=float) for c in OP_COLUMNS})
    a = host.attrs
    own = _self_us(host.start, host.end, a["tid"])
    device = np.zeros(len(host))
    layout_us = np.zeros(len(host))
    launched = np.zeros(len(host), dtype=np.int64)
    if len(kernels) or len(t.memcpy):
        launcher = _launching_ops(t)
        op_of = {int(c): int(launcher[j]) for j, c in enumerate(t.runtime.attrs["corr"])
                 if c >= 0 and launcher[j] >= 0}
        transposes = kernels.attrs["kind"] == K_LAYOUT
        for work, layout in ((kernels, transposes), (t.memcpy, np.zeros(len(t.memcpy), bool))):
            # kernels, and copies (a copy op's device time)
            for corr, dur, is_layout in zip(work.attrs["corr"], work.end - work.start, layout,
                                            strict=True):
                i = op_of.get(int(corr))
                if i is not None:
                    device[i] += dur
                    launched[i] += 1
                    if is_layout:
                        layout_us[i] += dur
    keep = np.ones(len(host), dtype=bool)
    if lo_us is not None:
        keep &= host.start >= lo_us
    if hi_us is not None:
        keep &= host.start < hi_us
    kind, dtype = a["cost_kind"], a["dtype"]
    frame = pd.DataFrame({
        "op": [t.names[n] for n in a["name"][keep]],
        "kind": [COST_KINDS[k] if k >= 0 else "" for k in kind[keep]],
        "dtype": [COST_DTYPES[d] if d >= 0 else "" for d in dtype[keep]],
        "self_s": own[keep] * US, "device_s": device[keep] * US,
        "kernels": launched[keep], "flops": a["flops"][keep].astype(float),
        "bytes": a["bytes"][keep].astype(float), "costed": kind[keep] >= 0,
        "layout_s": layout_us[keep] * US, "nchw": a["layout"][keep] == LAYOUT_NCHW,
        "nhwc": a["layout"][keep] == LAYOUT_NHWC,
    })
    g = frame.groupby("op", sort=False)
    table = pd.DataFrame({
        "kind": g["kind"].agg(lambda s: next((k for k in s if k), "")),
        "dtype": g["dtype"].agg(lambda s: next((d for d in s if d), "")),
        "calls": g.size(), "self_s": g["self_s"].sum(), "device_s": g["device_s"].sum(),
        "kernels": g["kernels"].sum(), "flops": g["flops"].sum(), "bytes": g["bytes"].sum(),
        "costed_calls": g["costed"].sum(), "layout_s": g["layout_s"].sum(),
        "nchw_calls": g["nchw"].sum(), "nhwc_calls": g["nhwc"].sum(),
    }).reset_index()
    order = "device_s" if t.has_gpu else "self_s"
    return table.sort_values(order, ascending=False, kind="stable").reset_index(drop=True)
