"""The per-event collector that doctor.trace.collect replaced, kept as the oracle its tests
compare with: each event sorted one at a time, in Python, into growable arrays (the code as it
was at 7f74d6b, with the kinds imported from doctor.trace.kinds)."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from doctor.trace.collectives import collective_args
from doctor.trace.events import EventArrays, Timeline
from doctor.trace.kinds import (
    COMM_OP,
    GPU_ANNOTATION,
    HOST_CATS,
    K_COMM,
    copy_kind,
    kernel_kind,
    runtime_kind,
)
from doctor.trace.op_costs import COST_DTYPES, COST_KINDS, OpCost, conv_layout, op_cost
from doctor.trace.reader import TraceMeta, TraceStream
from doctor.trace.typed_events import Args, Event, from_dicts, number

_NO_ARGS = Args()


def _f64(buf: array[float]) -> npt.NDArray[np.float64]:
    return np.frombuffer(buf, dtype=np.float64).copy() if len(buf) else np.empty(0, np.float64)


def _i64(buf: array[int]) -> npt.NDArray[np.int64]:
    return np.frombuffer(buf, dtype=np.int64).copy() if len(buf) else np.empty(0, np.int64)


@dataclass
class _Columns:
    """Growable typed columns for one kind of event: start, end, and integer attributes."""

    ints: tuple[str, ...] = ()
    start: array[float] = field(default_factory=lambda: array("d"))
    end: array[float] = field(default_factory=lambda: array("d"))
    extra: dict[str, array[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.extra = {name: array("q") for name in self.ints}
        self._appends = [self.extra[name].append for name in self.ints]

    def add(self, start: float, end: float, *values: int) -> None:
        self.start.append(start)
        self.end.append(end)
        for append, v in zip(self._appends, values, strict=True):
            append(v)

    def freeze(self, origin: float) -> EventArrays:
        s = _f64(self.start) - origin
        e = _f64(self.end) - origin
        order = np.argsort(s, kind="stable")
        return EventArrays(s[order], e[order], {k: _i64(v)[order] for k, v in self.extra.items()})


class _Collector:
    def __init__(self) -> None:
        self.names: list[str] = []
        self._name_ids: dict[str, int] = {}
        self._tids: dict[Any, int] = {}
        self.steps: dict[int, tuple[float, float]] = {}
        self.optimizer = _Columns(("tid",))
        self.host = _Columns(("tid", "name", "comm", "cost_kind", "dtype", "flops", "bytes",
                              "layout"))
        self.python = _Columns(("tid", "name"))
        self.dataloader = _Columns(("tid",))
        self.comm = _Columns(("tid", "coll", "bytes", "group", "name"))
        self.comm_kernels = _Columns(("coll", "bytes", "group", "corr"))
        self.kernels = _Columns(("kind", "name", "corr", "tid"))
        self.memcpy = _Columns(("kind", "mem", "bytes", "corr", "tid"))
        self.memset = _Columns(("tid",))
        self.runtime = _Columns(("kind", "tid", "name", "corr"))
        self.memory = _Columns(("device_type", "device", "allocated", "reserved"))
        self.first = float("inf")
        self.last = float("-inf")
        self.kernel_kinds: dict[str, int] = {}

    def name_id(self, name: str) -> int:
        nid = self._name_ids.get(name)
        if nid is None:
            nid = self._name_ids[name] = len(self.names)
            self.names.append(name)
        return nid

    @property
    def tid_names(self) -> list[str]:
        return list(self._tids)  # codes are given in order of first sight

    def tid_id(self, tid: Any) -> int:
        key = tid if type(tid) is str else str(tid)
        tid_id = self._tids.get(key)
        if tid_id is None:
            tid_id = self._tids[key] = len(self._tids)
        return tid_id

    def add(self, ev: Event) -> None:
        if ev.ph != "X":
            if ev.name == "[memory]":
                self._memory(ev)
            return
        ts, dur = ev.ts, ev.dur
        if ts is None or dur is None or dur < 0 or abs(ts) >= 2.0**52 or dur >= 2.0**52:
            return  # no time, or one past any clock (doctor.trace.collect.MAX_TIME_US)
        end = ts + dur
        name = ev.name or ""
        cat = ev.cat.lower() if ev.cat else ""
        if cat == "trace":
            return  # the profiler's own span
        if ts < self.first:
            self.first = ts
        if end > self.last:
            self.last = end
        args = ev.args if ev.args is not None else _NO_ARGS
        if cat == "kernel":
            kind = self.kernel_kinds.get(name)
            if kind is None:
                kind = self.kernel_kinds[name] = kernel_kind(name)
            self.kernels.add(ts, end, kind, self.name_id(name), _correlation(args),
                             self.tid_id(ev.tid))
            if kind == K_COMM:
                self.comm_kernels.add(ts, end, *collective_args(name, args),
                                      _correlation(args))
        elif cat in ("gpu_memcpy", "memcpy"):
            kind, mem = copy_kind(name, args)
            nbytes = number(args.get("bytes"))
            self.memcpy.add(ts, end, kind, mem, int(nbytes) if nbytes is not None else -1,
                            _correlation(args), self.tid_id(ev.tid))
        elif cat in ("gpu_memset", "memset"):
            self.memset.add(ts, end, self.tid_id(ev.tid))
        elif cat in ("cuda_runtime", "runtime", "cuda_driver"):
            kind = runtime_kind(name)
            self.runtime.add(ts, end, kind, self.tid_id(ev.tid), self.name_id(name),
                             _correlation(args))
        elif cat == GPU_ANNOTATION or cat.startswith("gpu_"):
            return
        elif cat == "python_function":
            self.python.add(ts, end, self.tid_id(ev.tid), self.name_id(name))
        else:
            self._host(name, cat, ts, end, ev, args)

    def _memory(self, ev: Event) -> None:
        args, ts = ev.args, ev.ts
        if args is None or ts is None:
            return
        values = [number(v) for v in (args.device_type, args.device_id, args.total_allocated,
                                       args.total_reserved)]
        if all(v is not None for v in values):
            self.memory.add(ts, ts, *(int(v) for v in values if v is not None))

    def _host(self, name: str, cat: str, ts: float, end: float, ev: Event, args: Args) -> None:
        if name.startswith("ProfilerStep#"):
            try:
                number = int(name[len("ProfilerStep#"):])
            except ValueError:
                return
            if number not in self.steps or ts < self.steps[number][0]:
                self.steps[number] = (ts, end)
            return
        if "DataLoader" in name and "__next__" in name:
            self.dataloader.add(ts, end, self.tid_id(ev.tid))
            return
        if name.startswith("Optimizer.step#"):
            self.optimizer.add(ts, end, self.tid_id(ev.tid))
        comm = name.lower().startswith(COMM_OP)
        if comm:
            self.comm.add(ts, end, self.tid_id(ev.tid), *collective_args(name, args),
                          self.name_id(name))
        if cat in HOST_CATS:
            dims = args.get("Input Dims")
            cost = op_cost(name, dims, args.get("Input type")) if dims is not None else None
            layout = conv_layout(name, dims, args.get("Input Strides")) \
                if cost is not None and "Input Strides" in args else 0
            self.host.add(ts, end, self.tid_id(ev.tid), self.name_id(name), int(comm),
                          *_cost_columns(cost), layout)


def _correlation(args: Args) -> int:
    """The correlation that ties a kernel to its launch (an integer of int64); -1: none."""
    value = args.correlation
    return value if type(value) is int and -(1 << 63) <= value < 1 << 63 else -1


def _cost_columns(cost: OpCost | None) -> tuple[int, int, int, int]:
    """(kind code, dtype code, flops, bytes) of an op's cost; -1 codes and zeros for none."""
    if cost is None:
        return -1, -1, 0, 0
    return (COST_KINDS.index(cost.kind), COST_DTYPES.index(cost.dtype), int(cost.flops),
            int(cost.bytes))


def _freeze(col: _Collector, meta: TraceMeta) -> Timeline:
    empty = col.first == float("inf")
    origin = 0.0 if empty else col.first
    steps = sorted((n, s - origin, e - origin) for n, (s, e) in col.steps.items())
    return Timeline(
        meta=meta,
        origin_us=origin,
        names=col.names,
        steps=steps,
        optimizer_steps=col.optimizer.freeze(origin),
        host_ops=col.host.freeze(origin),
        python=col.python.freeze(origin),
        dataloader=col.dataloader.freeze(origin),
        comm_ops=col.comm.freeze(origin),
        comm_kernels=col.comm_kernels.freeze(origin),
        kernels=col.kernels.freeze(origin),
        memcpy=col.memcpy.freeze(origin),
        memset=col.memset.freeze(origin),
        runtime=col.runtime.freeze(origin),
        memory=col.memory.freeze(origin),
        first_us=0.0,
        last_us=0.0 if empty else col.last - origin,
        tids=list(col.tid_names),
    )


def reference_timeline(path: str | Path) -> Timeline:
    """The timeline of the trace at ``path``, its events sorted one at a time."""
    stream = TraceStream(path)
    col = _Collector()
    for block in stream.blocks():
        for ev in block:
            col.add(ev)
    return _freeze(col, stream.meta)


def reference_from_dicts(events: list[dict[str, Any]]) -> Timeline:
    col = _Collector()
    for ev in from_dicts(events):
        col.add(ev)
    return _freeze(col, TraceMeta(path="<events>"))
