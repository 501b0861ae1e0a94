"""Sort the events of one trace into compact per-kind arrays: the timeline the step analysis reads.

One pass over the trace's blocks (scanned in C, doctor.trace.scan, or decoded by
:meth:`doctor.trace.reader.TraceStream.blocks`), each sorted into numpy columns a block at a
time (doctor.trace.collect): each event the analysis needs is
reduced to a few numbers (about 45 bytes, not a dict of Python objects), and past
doctor.trace.budget.MAX_EVENTS events only the first steps are kept. Names recognised across
releases (doctor.trace.kinds):

- host ops: category ``cpu_op`` (torch >= 1.9) or ``Operator`` (1.8); annotations
  ``user_annotation``; steps ``ProfilerStep#N``; DataLoader ``enumerate(DataLoader)#...__next__``;
- GPU: ``kernel``/``Kernel``, ``gpu_memcpy``/``Memcpy``, ``gpu_memset``/``Memset``, on CUDA and
  ROCm (HIP) alike; ``gpu_user_annotation`` is a GPU-side copy of host annotations and is ignored;
- runtime: ``cuda_runtime``/``Runtime``/``cuda_driver`` with ``cuda*``, ``cu*`` or ``hip*`` names;
- collectives: NCCL/RCCL kernels, and host ops named ``nccl:*``, ``gloo:*``, ``c10d::*``,
  ``record_param_comms``;
- memory (``profile_memory=True``): instant events ``[memory]`` with the allocator's totals after
  each allocation and free, per device (``Device Type`` 1: the GPU, CUDA or ROCm).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from doctor.trace.budget import EventBudget, TraceCut
from doctor.trace.collect import COLUMN_TYPES, KIND_COLUMNS, BlockCollector
from doctor.trace.heap import release_freed_memory
from doctor.trace.reader import TraceMeta, TraceStream
from doctor.trace.scan import AVAILABLE as SCANNER
from doctor.trace.scan import NotScanned, load_scanned
from doctor.trace.typed_events import from_dicts

__all__ = ["Timeline", "build_timeline", "load_timeline", "release_freed_memory"]



@dataclass(frozen=True)
class EventArrays:
    """Events of one kind sorted by start (microseconds from the trace origin)."""

    start: npt.NDArray[np.float64]
    end: npt.NDArray[np.float64]
    attrs: dict[str, npt.NDArray[np.integer[Any]]]  # types: doctor.trace.collect.COLUMN_TYPES

    def __len__(self) -> int:
        return int(self.start.size)


@dataclass(frozen=True)
class Timeline:
    """What the step analysis needs from one trace; times in microseconds from ``origin_us``."""

    meta: TraceMeta
    origin_us: float
    names: list[str]
    steps: list[tuple[int, float, float]]  # (step number, start, end) from ProfilerStep#N
    optimizer_steps: EventArrays  # attrs: tid
    host_ops: EventArrays  # attrs: tid, name, comm (1 for collectives), cost_kind and dtype
    # (codes in op_costs.COST_KINDS/COST_DTYPES, -1: no cost), flops, bytes, layout (a
    # convolution's input: op_costs.LAYOUTS)
    python: EventArrays  # python_function events (with_stack): tid, name
    dataloader: EventArrays  # attrs: tid
    comm_ops: EventArrays  # attrs: tid, coll, bytes, group (doctor.trace.collectives; -1:
    # not in the trace), name
    comm_kernels: EventArrays  # the collectives' kernels: coll, bytes, group, corr
    kernels: EventArrays  # attrs: kind, name, corr (the correlation of its launch), tid (stream)
    memcpy: EventArrays  # attrs: kind, mem, bytes, corr, tid
    memset: EventArrays  # attrs: tid
    runtime: EventArrays  # attrs: kind, tid, name, corr
    memory: EventArrays  # [memory] instants: device_type, device, allocated, reserved (bytes)
    first_us: float
    last_us: float
    tids: list[str] = field(default_factory=list)  # the trace's ``tid`` of each tid code
    cut: TraceCut | None = None  # the steps left out to keep memory bounded (trace.budget)

    @property
    def has_gpu(self) -> bool:
        return len(self.kernels) + len(self.memcpy) + len(self.memset) > 0


def build_timeline(events: Iterable[dict[str, Any]], meta: TraceMeta | None = None) -> Timeline:
    """Reduce an iterable of trace events (dicts) to a :class:`Timeline`."""
    col = BlockCollector()
    col.add(from_dicts(events))
    return freeze(col, meta or TraceMeta(path="<events>"))


def load_timeline(path: str | Path, max_events: int | None = None) -> Timeline:
    """Stream the trace at ``path`` into a :class:`Timeline` (raises TraceError if unreadable),
    never a dict per event: scanned in C straight into columns (doctor.trace.scan) where the
    scanner is built, else (and for a file it cannot scan) blocks of events decoded into typed
    records (doctor.trace.typed_events); either way sorted into the timeline's columns a block
    at a time (doctor.trace.collect)."""
    if SCANNER:
        col, budget = BlockCollector(), EventBudget(max_events)
        try:
            meta = load_scanned(Path(path), col, budget)
        except NotScanned:
            pass  # read again the slow way, which says what is wrong
        else:
            return _frozen(col, meta, budget)
    stream = TraceStream(path)
    col = BlockCollector()
    budget = EventBudget(max_events)
    for block in stream.blocks():
        col.add(block)
        budget.apply(col)
    return _frozen(col, stream.meta, budget)


def _frozen(col: BlockCollector, meta: TraceMeta, budget: EventBudget) -> Timeline:
    timeline = freeze(col, meta, budget.finish(col))
    del col
    release_freed_memory()
    return timeline


def _arrays(col: BlockCollector, kind: str, origin: float) -> EventArrays:
    """One kind's columns, sorted by start (stable: events that start together keep the
    trace's order)."""
    chunks = col.chunks.pop(kind)
    names = KIND_COLUMNS[kind]
    if not chunks:
        empty = np.empty(0, np.float64)
        return EventArrays(empty, empty.copy(), {k: np.empty(0, COLUMN_TYPES[k]) for k in names})
    # one column at a time, its pieces let go as soon as joined: memory for the columns and
    # one more, not twice the columns
    pieces: list[list[np.ndarray]] = [[c[0] for c in chunks], [c[1] for c in chunks],
                                      *([c[2][n] for c in chunks] for n in range(len(names)))]
    del chunks
    start, pieces[0] = np.concatenate(pieces[0]) - origin, []
    order = np.argsort(start, kind="stable")
    start = start[order]
    columns: list[Any] = []
    for k in range(1, len(pieces)):
        column, pieces[k] = np.concatenate(pieces[k]), []
        columns.append(column[order] - origin if k == 1 else column[order])
    del pieces, order, column
    release_freed_memory()  # the pieces, freed in the heap's middle: before the next kind's
    return EventArrays(start, columns[0], dict(zip(names, columns[1:], strict=True)))


def freeze(col: BlockCollector, meta: TraceMeta, cut: TraceCut | None = None) -> Timeline:
    """The timeline of what ``col`` collected (``cut``: what the budget left out)."""
    empty = col.first == float("inf")
    origin = 0.0 if empty else col.first
    steps = sorted((n, s - origin, e - origin) for n, (s, e) in col.steps.items())
    return Timeline(
        meta=meta,
        origin_us=origin,
        names=col.names,
        steps=steps,
        optimizer_steps=_arrays(col, "optimizer", origin),
        host_ops=_arrays(col, "host", origin),
        python=_arrays(col, "python", origin),
        dataloader=_arrays(col, "dataloader", origin),
        comm_ops=_arrays(col, "comm", origin),
        comm_kernels=_arrays(col, "comm_kernels", origin),
        kernels=_arrays(col, "kernels", origin),
        memcpy=_arrays(col, "memcpy", origin),
        memset=_arrays(col, "memset", origin),
        runtime=_arrays(col, "runtime", origin),
        memory=_arrays(col, "memory", origin),
        first_us=0.0,
        last_us=0.0 if empty else col.last - origin,
        tids=list(col.tid_names),
        cut=cut,
    )
