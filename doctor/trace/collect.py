"""Sort a block of trace events into per-kind columns, a whole block at a time.

A block comes as columns (:meth:`BlockCollector.add_columns`: the C scanner's, through
doctor.trace.scan) or as typed records (:meth:`BlockCollector.add`: tens of thousands of
:class:`doctor.trace.typed_events.Event`, made into the same columns by a list comprehension per
field, each category, name and thread coded by a dict's own lookup). What each category and
name means is decided once per distinct value (doctor.trace.kinds) and looked up for a column of
codes at once, and each kind of event is picked out of the block with a mask. Only the events
that need their ``args`` have them read (doctor.trace.block_args): copies, collectives, memory
instants, and the host ops whose name has a cost formula (doctor.trace.op_costs), each distinct
one computed once (doctor.trace.distinct_rows). The result is the same as sorting the events
one by one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

try:
    import msgspec
except ImportError:  # pragma: no cover - a dependency; doctor.trace.typed_events falls back
    msgspec = None  # type: ignore[assignment]

from doctor.trace.block_args import BlockArgs, EventArgs
from doctor.trace.collectives import collective_args
from doctor.trace.distinct_rows import Rows, copy_row, op_row, rows_by_text
from doctor.trace.kinds import (
    COMM_OP,
    GPU_ANNOTATION,
    HOST_CATS,
    K_COMM,
    kernel_kind,
    runtime_kind,
)
from doctor.trace.op_costs import (
    CONV,
    CONV_BACKWARD,
    COPY,
    ELEMENTWISE,
    MATMUL,
    NORMALISE,
)
from doctor.trace.typed_events import Args, Event

Int64s = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]

# What an event's category makes it (one code per distinct category).
C_HOST, C_HOST_OP, C_TRACE, C_KERNEL, C_MEMCPY, C_MEMSET, C_RUNTIME, C_GPU, C_PYTHON = range(9)
#: Names with a cost formula: only their host ops have their shapes read.
_COSTED = MATMUL | CONV | CONV_BACKWARD | ELEMENTWISE | NORMALISE | COPY
_NO_ARGS = Args()
_STEP = "ProfilerStep#"
#: Times (µs) at or past this are damage, not a clock: 2**52 µs is the year 2112 on the epoch
#: clock Kineto uses, and float64 keeps every µs below it (the analysis turns µs into int64 ns).
MAX_TIME_US = float(2**52)
#: The args of a ``[memory]`` instant the timeline keeps.
MEMORY_KEYS = ("Device Type", "Device Id", "Total Allocated", "Total Reserved")
#: The args a host op's cost (doctor.trace.op_costs) is computed from.
COST_KEYS = ("Input Dims", "Input type", "Input Strides")
#: The args a copy's kind and size are read from.
COPY_KEYS = ("kind", "bytes")
#: The args collective_args reads.
COLLECTIVE_KEYS = ("Collective name", "In msg nelems", "Out msg nelems", "dtype", "Group size",
                   "Input Dims", "Input type")
# What a host event's name makes it.
R_OP, R_STEP, R_NOT_A_STEP, R_DATALOADER = 0, 1, 2, 3
#: Each kind's integer columns, in the order the Timeline keeps them.
KIND_COLUMNS: dict[str, tuple[str, ...]] = {
    "optimizer": ("tid",),
    "host": ("tid", "name", "comm", "cost_kind", "dtype", "flops", "bytes", "layout"),
    "python": ("tid", "name"),
    "dataloader": ("tid",),
    "comm": ("tid", "coll", "bytes", "group", "name"),
    "comm_kernels": ("coll", "bytes", "group", "corr"),
    "kernels": ("kind", "name", "corr", "tid"),
    "memcpy": ("kind", "mem", "bytes", "corr", "tid"),
    "memset": ("tid",),
    "runtime": ("kind", "tid", "name", "corr"),
    "memory": ("device_type", "device", "allocated", "reserved"),
}
#: The integer type of each column: codes of a few values in a byte, of names, threads and
#: groups in four; counts, bytes and correlations in eight (a column of millions of events
#: takes half the memory it would all in eight).
COLUMN_TYPES: dict[str, type[np.integer[Any]]] = {
    "comm": np.int8, "cost_kind": np.int8, "dtype": np.int8, "layout": np.int8,
    "kind": np.int8, "mem": np.int8, "coll": np.int8, "device_type": np.int8,
    "tid": np.int32, "name": np.int32, "group": np.int32, "device": np.int32,
    "flops": np.int64, "bytes": np.int64, "corr": np.int64, "allocated": np.int64,
    "reserved": np.int64,
}


class _Lookup(dict[Any, int]):
    """A dict that computes (once) what a key it has not seen maps to."""

    def __init__(self, compute: Callable[[Any], int]) -> None:
        super().__init__()
        self._compute = compute

    def __missing__(self, key: Any) -> int:
        value = self[key] = self._compute(key)
        return value

    def codes(self, keys: Sequence[Any] | npt.NDArray[Any]) -> Int64s:
        """What each of ``keys`` maps to, as an array (the loop runs in C)."""
        return np.fromiter(map(self.__getitem__, keys), np.int64, len(keys))


class _ByCode:
    """What each name code maps to, computed once per code and looked up for a column of codes
    at once (numpy indexing, no Python per event)."""

    def __init__(self, compute: Callable[[int], int]) -> None:
        self._compute = compute
        self._values = np.zeros(0, np.int64)
        self._known = np.zeros(0, np.bool_)

    def codes(self, keys: Int64s) -> Int64s:
        if not len(keys):
            return np.zeros(0, np.int64)
        top = int(keys.max()) + 1
        if top > len(self._values):
            grow = max(top, 2 * len(self._values)) - len(self._values)
            self._values = np.concatenate([self._values, np.zeros(grow, np.int64)])
            self._known = np.concatenate([self._known, np.zeros(grow, np.bool_)])
        known = self._known[keys]
        if not known.all():
            for k in np.unique(keys[~known]).tolist():
                self._values[k] = self._compute(k)
                self._known[k] = True
        return self._values[keys]


def _category(cat: Any) -> int:
    low = cat.lower() if isinstance(cat, str) and cat else ""
    if low == "trace":
        return C_TRACE  # the profiler's own span
    if low == "kernel":
        return C_KERNEL
    if low in ("gpu_memcpy", "memcpy"):
        return C_MEMCPY
    if low in ("gpu_memset", "memset"):
        return C_MEMSET
    if low in ("cuda_runtime", "runtime", "cuda_driver"):
        return C_RUNTIME
    if low == GPU_ANNOTATION or low.startswith("gpu_"):
        return C_GPU  # a GPU-side copy of host annotations: not read
    if low == "python_function":
        return C_PYTHON
    return C_HOST_OP if low in HOST_CATS else C_HOST


def _host_role(name: str) -> int:
    if name.startswith(_STEP):
        try:
            int(name[len(_STEP):])
        except ValueError:
            return R_NOT_A_STEP
        return R_STEP
    return R_DATALOADER if "DataLoader" in name and "__next__" in name else R_OP


class BlockCollector:
    """Columns of every kind of event, added to a block at a time (:meth:`add`)."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.tid_names: list[str] = []  # the trace's tid of each code, in order of first sight
        self.steps: dict[int, tuple[float, float]] = {}
        self.first = float("inf")
        self.last = float("-inf")
        self.chunks: dict[str, list[tuple[Floats, Floats, list[Int64s]]]] = {
            kind: [] for kind in KIND_COLUMNS}
        self._categories = _Lookup(_category)
        self._name_codes = _Lookup(self._new_name)
        self._tid_codes = _Lookup(self._new_tid)
        self._tid_of_text: dict[str, int] = {}
        self._kernel_kinds = _ByCode(lambda code: kernel_kind(self.names[code]))
        self._runtime_kinds = _ByCode(lambda code: runtime_kind(self.names[code]))
        self._host_roles = _ByCode(lambda code: _host_role(self.names[code]))
        self._optimizer = _ByCode(lambda code: int(self.names[code].startswith("Optimizer.step#")))
        self._comm = _ByCode(lambda code: int(self.names[code].lower().startswith(COMM_OP)))
        self._collectives: dict[bytes | str, tuple[int, int, int]] = {}
        self._collectives_by_text = Rows(3)
        self._costs = Rows(5)
        self._copies = Rows(3)
        self._costed = _ByCode(lambda code: int(self.names[code] in _COSTED))

    def name_code(self, name: str) -> int:
        """The code of ``name`` (given now if it has none)."""
        return self._name_codes[name]

    def tid_code(self, tid: str) -> int:
        """The code of the thread or stream ``tid`` (given now, in order, if it has none)."""
        return self._tid_codes[tid]

    def _new_name(self, name: Any) -> int:
        text = name if isinstance(name, str) and name else ""
        if text is not name:
            return self._name_codes[text]
        self.names.append(text)
        return len(self.names) - 1

    def _new_tid(self, tid: Any) -> int:
        text = tid if type(tid) is str else str(tid)
        code = self._tid_of_text.get(text)
        if code is None:
            code = self._tid_of_text[text] = len(self.tid_names)
            self.tid_names.append(text)
        return code

    def _put(self, kind: str, start: Floats, end: Floats, *columns: Int64s | Sequence[int]
             ) -> None:
        if len(start):
            self.chunks[kind].append((start, end, [
                np.asarray(c, COLUMN_TYPES[name])
                for name, c in zip(KIND_COLUMNS[kind], columns, strict=True)]))

    def category_code(self, cat: str) -> int:
        """What events of category ``cat`` are (C_HOST, C_KERNEL, ...)."""
        return self._categories[cat]

    def add(self, events: list[Event]) -> None:
        """Sort one block of events into the columns."""
        if not events:
            return
        # a list comprehension per field: faster than one tuple per event
        timed = np.array([e.ph for e in events], dtype=object) == "X"
        codes = self._name_codes.codes([e.name for e in events])
        ts = np.array([e.ts for e in events], dtype=np.float64)
        dur = np.array([e.dur for e in events], dtype=np.float64)
        cls = self._categories.codes([e.cat for e in events])

        def tid_codes(at: Int64s) -> Int64s:
            return self._tid_codes.codes([events[j].tid for j in at.tolist()])

        self.add_columns(timed, codes, ts, dur, cls, tid_codes, EventArgs(events))

    def add_columns(self, timed: npt.NDArray[np.bool_], codes: Int64s, ts: Floats, dur: Floats,
                    cls: Int64s, tid_codes: Callable[[Int64s], Int64s], args: BlockArgs
                    ) -> None:
        """Sort one block of events, given as columns, into the columns: whether each is a
        complete event (``ph`` "X"), its name's code (:meth:`name_code`), start and duration
        (nan: none), what its category makes it (:meth:`category_code`); ``tid_codes`` gives
        the thread codes of the events at the indices it is given (:meth:`tid_code`, in that
        order), ``args`` their ``args``."""
        n = len(timed)
        if not n:
            return
        if not timed.all():
            self._memory(np.flatnonzero(~timed & (codes == self._name_codes["[memory]"])),
                         ts, args)
        with np.errstate(invalid="ignore"):
            keep = (timed & (np.abs(ts) < MAX_TIME_US) & (dur >= 0) & (dur < MAX_TIME_US)
                    & (cls != C_TRACE))  # nan fails each comparison
        idx = np.flatnonzero(keep)
        if not len(idx):
            return
        end = ts + dur
        self.first = min(self.first, float(ts[idx].min()))
        self.last = max(self.last, float(end[idx].max()))
        names = self.names
        roles = np.full(n, -1, np.int64)
        host = np.flatnonzero(keep & ((cls == C_HOST) | (cls == C_HOST_OP)))
        roles[host] = self._host_roles.codes(codes[host])
        ops = host[roles[host] == R_OP]
        optimizer = ops[self._optimizer.codes(codes[ops]).astype(bool)]
        comm = self._comm.codes(codes[ops]).astype(bool)
        host_ops = ops[comm | (cls[ops] == C_HOST_OP)]
        # the thread or stream codes, given in event order to the events that keep one
        with_tid = keep & ((cls == C_KERNEL) | (cls == C_MEMCPY) | (cls == C_MEMSET)
                           | (cls == C_RUNTIME) | (cls == C_PYTHON) | (roles == R_DATALOADER))
        with_tid[optimizer] = True
        with_tid[host_ops] = True
        tids = np.full(n, -1, np.int64)
        tid_at = np.flatnonzero(with_tid)
        tids[tid_at] = tid_codes(tid_at)
        at = {c: idx[cls[idx] == c] for c in (C_KERNEL, C_MEMCPY, C_MEMSET, C_RUNTIME,
                                              C_PYTHON)}
        self._kernels(at[C_KERNEL], ts, end, codes, tids, names, args)
        self._memcpy(at[C_MEMCPY], ts, end, codes, tids, names, args)
        i = at[C_MEMSET]
        self._put("memset", ts[i], end[i], tids[i])
        i = at[C_RUNTIME]
        self._put("runtime", ts[i], end[i], self._runtime_kinds.codes(codes[i]), tids[i],
                  codes[i], args.correlations(i))
        i = at[C_PYTHON]
        self._put("python", ts[i], end[i], tids[i], codes[i])
        for j in host[roles[host] == R_STEP].tolist():
            number = int(names[codes[j]][len(_STEP):])
            if number not in self.steps or ts[j] < self.steps[number][0]:
                self.steps[number] = (float(ts[j]), float(end[j]))
        i = host[roles[host] == R_DATALOADER]
        self._put("dataloader", ts[i], end[i], tids[i])
        self._put("optimizer", ts[optimizer], end[optimizer], tids[optimizer])
        self._comm_ops(ops[comm], ts, end, codes, tids, names, args)
        self._host_ops(host_ops[cls[host_ops] == C_HOST_OP], ts, end, codes, tids, names, args)

    def _kernels(self, i: Int64s, ts: Floats, end: Floats, codes: Int64s, tids: Int64s,
                 names: list[str], args: BlockArgs) -> None:
        kinds = self._kernel_kinds.codes(codes[i])
        corr = args.correlations(i)
        self._put("kernels", ts[i], end[i], kinds, codes[i], corr, tids[i])
        comm = np.flatnonzero(kinds == K_COMM)
        rows = self._collective_rows(i[comm], codes, args)
        self._put("comm_kernels", ts[i[comm]], end[i[comm]], *rows.T, corr[comm])

    def _memcpy(self, i: Int64s, ts: Floats, end: Floats, codes: Int64s, tids: Int64s,
                names: list[str], args: BlockArgs) -> None:
        rows = rows_by_text(self.names, i, codes, args, COPY_KEYS, self._copies, copy_row)
        self._put("memcpy", ts[i], end[i], *rows.T, args.correlations(i), tids[i])

    def _comm_ops(self, i: Int64s, ts: Floats, end: Floats, codes: Int64s, tids: Int64s,
                  names: list[str], args: BlockArgs) -> None:
        rows = self._collective_rows(i, codes, args)
        self._put("comm", ts[i], end[i], tids[i], *rows.T, codes[i])

    def _host_ops(self, i: Int64s, ts: Floats, end: Floats, codes: Int64s, tids: Int64s,
                  names: list[str], args: BlockArgs) -> None:
        """The host ops (``cpu_op``): their cost where the name has a formula and the trace
        has the shapes."""
        m = len(i)
        cost = np.full((4, m), -1, np.int64)
        cost[2:] = 0
        layout = np.zeros(m, np.int64)
        costed = np.flatnonzero(self._costed.codes(codes[i]))
        table = rows_by_text(self.names, i[costed], codes, args, COST_KEYS, self._costs,
                             op_row).T
        cost[:, costed] = table[:4]
        layout[costed] = table[4]
        comm = self._comm.codes(codes[i])
        self._put("host", ts[i], end[i], tids[i], codes[i], comm, *cost, layout)

    def _collective_rows(self, i: Int64s, codes: Int64s, args: BlockArgs
                         ) -> npt.NDArray[np.int64]:
        """collective_args of the host ops or kernels at ``i``."""
        return rows_by_text(self.names, i, codes, args, COLLECTIVE_KEYS, self._collectives_by_text,
                                  self._collective)

    def _collective(self, name: str, args: Args | None) -> tuple[int, int, int]:
        """collective_args of a host op or kernel, once per distinct name and arguments (the
        calls of a job repeat every step)."""
        a = args or _NO_ARGS
        key = _key((name, a.collective_name, a.in_nelems, a.out_nelems, a.dtype, a.group_size,
                    a.input_dims, a.input_type))
        found = self._collectives.get(key)
        if found is None:
            found = self._collectives[key] = collective_args(name, a)
        return found

    def _memory(self, i: Int64s, ts: Floats, args: BlockArgs) -> None:
        """``[memory]`` instants: the allocator's totals after each allocation and free."""
        values = args.numbers(i, MEMORY_KEYS)
        times = ts[i]
        ok = ~np.isnan(times) & ~np.isnan(values).any(axis=1)
        self._put("memory", times[ok], times[ok].copy(),
                  *(values[ok, k].astype(np.int64) for k in range(len(MEMORY_KEYS))))


def _key(values: tuple[Any, ...]) -> bytes | str:
    """A key for JSON values that tells 1, 1.0 and true apart."""
    if msgspec is not None:
        return msgspec.json.encode(values)
    return repr(values)  # pragma: no cover - msgspec missing
