"""The ops of a trace, one row per op name: calls, the host's own time in them (time in the ops
they call taken out), the device time of the kernels they launched, and their operations and
bytes (doctor.trace.op_costs, where the trace has shapes).

An op's own host time is its duration less that of the ops nested directly inside it on the same
thread, so a composite (``aten::linear``) and what it calls (``aten::addmm``) add up to the
composite's duration once. A kernel belongs to the host op that launched it: its launch (the
runtime call with the same ``correlation``) falls inside that op, the innermost one on the
launching thread. ``opt_self_s`` and ``opt_device_s`` are the parts of ``self_s`` and
``device_s`` of the calls made inside an optimizer's step (``Optimizer.step#...`` on the same
thread): an unfused Adam's ``mul_``, ``sqrt`` and ``lerp_`` are the optimizer's cost, with their
own fix (foreach or fused), not ops for torch.compile to fuse.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from doctor.trace.compiled_regions import host_op_regions, is_compiled_code
from doctor.trace.events import Timeline
from doctor.trace.kinds import K_LAYOUT
from doctor.trace.op_costs import COST_DTYPES, COST_KINDS, LAYOUT_NCHW, LAYOUT_NHWC

try:  # the loops below in C (doctor/trace/_nest.c), where the package was built with them
    from doctor.trace import _nest
except ImportError:
    _nest = None  # type: ignore[assignment]

#: Whether the ops' nesting is computed in C (0.07 s for 2 M events; the loops take 0.76 s).
NESTING_IN_C = _nest is not None

US = 1e-6
OP_COLUMNS = ("op", "kind", "dtype", "calls", "self_s", "device_s", "kernels", "flops",
              "bytes", "costed_calls", "layout_s", "nchw_calls", "nhwc_calls", "opt_self_s",
              "opt_device_s", "region", "compiled_self_s", "compiled_device_s")
COMPILED = "compiled"  # the kind of Inductor's and AOTAutograd's own ops (compiled_regions)


def _self_us(start: np.ndarray, end: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """Each op's duration less its direct children's on the same thread (events sorted by
    start, as EventArrays are): in C where it is built, else this loop, which reads the
    arrays through memoryviews (indexing numpy arrays one element at a time costs several
    times more, and lists of Python numbers several times the memory)."""
    own = np.ascontiguousarray(end - start, dtype=np.float64)
    if _nest is not None and _nest.self_times(_floats(start), _floats(end), _codes(tid), own):
        return np.maximum(own, 0.0)
    mine, starts, ends = _view(own), _view(start), _view(end)
    stacks: dict[int, list[int]] = {}
    for i, t in enumerate(_view(tid)):
        stack = stacks.get(t)
        if stack is None:
            stack = stacks[t] = []
        s = starts[i]
        while stack and ends[stack[-1]] <= s:
            stack.pop()
        if stack:
            mine[stack[-1]] -= ends[i] - s
        stack.append(i)
    return np.maximum(own, 0.0)


def in_optimizer(t: Timeline) -> np.ndarray:
    """For each host op, whether it starts inside an optimizer step on its own thread."""
    host, steps = t.host_ops, t.optimizer_steps
    inside = np.zeros(len(host), dtype=bool)
    if not len(steps) or not len(host):
        return inside
    tids = host.attrs["tid"]
    for tid in np.unique(steps.attrs["tid"]):
        mine = steps.attrs["tid"] == tid
        order = np.argsort(steps.start[mine], kind="stable")
        starts, ends = steps.start[mine][order], steps.end[mine][order]
        ops = np.flatnonzero(tids == tid)
        at = np.searchsorted(starts, host.start[ops], side="right") - 1
        hit = at >= 0
        hit[hit] = host.start[ops][hit] < ends[at[hit]]
        inside[ops[hit]] = True
    return inside


def _view(values: np.ndarray) -> memoryview:
    """The elements of ``values`` as Python numbers, one at a time (no copy when contiguous;
    a memoryview of a writable array writes through to it)."""
    return np.ascontiguousarray(values).data


def _launching_ops(t: Timeline) -> np.ndarray:
    """For each runtime call, the index of the innermost host op on its thread that contains
    it (-1: none)."""
    host, rt = t.host_ops, t.runtime
    found = np.full(len(rt), -1, dtype=np.int64)
    if not len(host) or not len(rt):
        return found
    if _nest is not None and _nest.launching_ops(
            _floats(host.start), _floats(host.end), _codes(host.attrs["tid"]), _floats(rt.start),
            _codes(rt.attrs["tid"]), found):
        return found
    out = _view(found)
    h_start, h_end, r_start = _view(host.start), _view(host.end), _view(rt.start)
    by_tid = _group(host.attrs["tid"])
    none = _view(np.empty(0, np.int64))
    for tid, calls in _group(rt.attrs["tid"]).items():
        ops = by_tid.get(tid, none)
        stack: list[int] = []
        k = 0
        for j in calls:  # runtime calls and host ops both sorted by start
            at = r_start[j]
            while k < len(ops) and h_start[ops[k]] <= at:
                while stack and h_end[stack[-1]] <= h_start[ops[k]]:
                    stack.pop()
                stack.append(ops[k])
                k += 1
            while stack and h_end[stack[-1]] < at:
                stack.pop()
            if stack:
                out[j] = stack[-1]
    return found


def _floats(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.float64)


def _codes(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.int32)


def _group(values: np.ndarray) -> dict[int, memoryview]:
    """The indices of each value, in order."""
    order = np.argsort(values, kind="stable")
    keys, first = np.unique(values[order], return_index=True)
    return {int(k): _view(part) for k, part in zip(keys, np.split(order, first[1:]),
                                                   strict=True)}


def _first_named(group: np.ndarray, count: int, codes: np.ndarray, labels: Sequence[str]
                 ) -> list[str]:
    """Each group's label of the first of its calls whose code names one ("" for none)."""
    named = np.isin(codes, [k for k, v in enumerate(labels) if v])
    found, first = np.unique(group[named], return_index=True)
    out = [""] * count
    for g, code in zip(found.tolist(), codes[named][first].tolist(), strict=True):
        out[g] = labels[code]
    return out


def _main_region(group: np.ndarray, count: int, region: np.ndarray, time: np.ndarray,
                 labels: list[str]) -> list[str]:
    """Each group's region where most of its time ran ("" where that is outside all)."""
    out = [""] * count
    inside = region >= 0
    if not inside.any():
        return out
    per = pd.Series(time[inside] + 1e-9).groupby([group[inside], region[inside]]).sum()
    outside = pd.Series(time[~inside] + 1e-9).groupby(group[~inside]).sum()
    for g, r in per.groupby(level=0).idxmax().tolist():
        if per[(g, r)] > outside.get(g, 0.0):
            out[int(g)] = labels[int(r)]
    return out


def last_of(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A lookup table from ``keys`` to ``values`` where a key given twice maps to its last
    value (as a dict built in order would): (sorted keys, their values) for :func:`look_up`."""
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    last = np.ones(len(order), dtype=bool)
    last[:-1] = sorted_keys[1:] != sorted_keys[:-1]
    return sorted_keys[last], values[order][last]


def look_up(table: tuple[np.ndarray, np.ndarray], keys: np.ndarray, missing: int = -1
            ) -> np.ndarray:
    """The value of each of ``keys`` in a :func:`last_of` table (``missing`` where absent)."""
    sorted_keys, values = table
    if not len(sorted_keys):
        return np.full(len(keys), missing, dtype=np.int64)
    at = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
    return np.where(sorted_keys[at] == keys, values[at], missing)


def op_table(t: Timeline, lo_us: float | None = None, hi_us: float | None = None
             ) -> pd.DataFrame:
    """One row per op name that started within [lo_us, hi_us) (the whole trace by default),
    the most time first (device time on a GPU trace, the host's own time otherwise). ``device_s``
is the time of the kernels and copies the op launched; ``kernels`` counts both; ``layout_s`` is
    the part of it in NCHW/NHWC transposes; ``nchw_calls`` and ``nhwc_calls`` count the calls of
    a convolution whose input the strides show in that memory format. ``region`` is the
    torch.compile'd region (``0/1``: frame 0's second compilation) where most of the op's own
    time ran ("" where none: eager), and ``compiled_self_s``/``compiled_device_s`` its time
    inside compiled regions (doctor.trace.compiled_regions); Inductor's and AOTAutograd's own
    ops are of kind ``compiled``."""
    host, kernels = t.host_ops, t.kernels
    if not len(host):
        return pd.DataFrame({c: pd.Series(dtype=float) for c in OP_COLUMNS})
    a = host.attrs
    device = np.zeros(len(host))
    layout_us = np.zeros(len(host))
    launched = np.zeros(len(host), dtype=np.int64)
    if len(kernels) or len(t.memcpy):
        launcher = _launching_ops(t)
        corr = t.runtime.attrs["corr"]
        known = (corr >= 0) & (launcher >= 0)
        op_of = last_of(corr[known], launcher[known])
        del launcher, known  # one column of each event at a time: a 2 M-event trace's peak
        transposes = kernels.attrs["kind"] == K_LAYOUT
        for work, layout in ((kernels, transposes), (t.memcpy, np.zeros(len(t.memcpy), bool))):
            # kernels, and copies (a copy op's device time); np.add.at adds in order, as a
            # loop would
            i = look_up(op_of, work.attrs["corr"])
            found = i >= 0
            dur = (work.end - work.start)[found]
            np.add.at(device, i[found], dur)
            np.add.at(launched, i[found], 1)
            np.add.at(layout_us, i[found][layout[found]], dur[layout[found]])
        del op_of
    own = _self_us(host.start, host.end, a["tid"])
    optimizer = in_optimizer(t)
    keep: slice | np.ndarray = slice(None)  # the whole trace: no copy of each column
    if lo_us is not None or hi_us is not None:
        keep = np.ones(len(host), dtype=bool)
        if lo_us is not None:
            keep &= host.start >= lo_us
        if hi_us is not None:
            keep &= host.start < hi_us
    # grouped by the name's code, in the order names first come: the counts by np.bincount
    # (exact), the sums of seconds, flops and bytes by pandas (compensated, as before), one
    # column at a time (no frame of every op: a copy of each column)
    group, names = pd.factorize(a["name"][keep], sort=False)
    count = len(names)

    def total(values: np.ndarray) -> np.ndarray:
        return np.bincount(group, weights=values, minlength=count).astype(np.int64)

    def summed(values: np.ndarray) -> np.ndarray:
        return pd.Series(values).groupby(group, sort=False).sum().to_numpy()

    kind, dtype, layout = a["cost_kind"][keep], a["dtype"][keep], a["layout"][keep]
    op_names = [t.names[int(n)] for n in names]
    in_region, regions = host_op_regions(t)
    in_region = in_region[keep]
    compiled = in_region >= 0
    table = pd.DataFrame({
        "op": op_names,
        **{column: _first_named(group, count, codes, labels)
           for column, codes, labels in (("kind", kind, COST_KINDS),
                                         ("dtype", dtype, COST_DTYPES))},
        "calls": np.bincount(group, minlength=count).astype(np.int64),
        "self_s": summed(own[keep] * US), "device_s": summed(device[keep] * US),
        "kernels": total(launched[keep]), "flops": summed(a["flops"][keep].astype(float)),
        "bytes": summed(a["bytes"][keep].astype(float)), "costed_calls": total(kind >= 0),
        "layout_s": summed(layout_us[keep] * US), "nchw_calls": total(layout == LAYOUT_NCHW),
        "nhwc_calls": total(layout == LAYOUT_NHWC),
        "opt_self_s": summed(np.where(optimizer, own, 0.0)[keep] * US),
        "opt_device_s": summed(np.where(optimizer, device, 0.0)[keep] * US),
        "region": _main_region(group, count, in_region, (device if t.has_gpu else own)[keep],
                               regions),
        **{column: summed(np.where(compiled, values[keep], 0.0) * US) if regions
           else np.zeros(count) for column, values in (("compiled_self_s", own),
                                                        ("compiled_device_s", device))},
    })
    code = np.fromiter((is_compiled_code(n) for n in op_names), bool, count)
    table.loc[code & (table["kind"] == "").to_numpy(), "kind"] = COMPILED
    order = "device_s" if t.has_gpu else "self_s"
    return table.sort_values(order, ascending=False, kind="stable").reset_index(drop=True)
