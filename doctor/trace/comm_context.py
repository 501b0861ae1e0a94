"""Where each collective of a trace was issued from: the host time of its call, and around it
the step's phase (forward, backward, optimizer) and the sharding unit whose hook issued it; the
c10d call that enqueued each backend's work (gloo's thread); the issuing thread's waits for its
collectives; and the host ops' time outside communication (what can hide a collective)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from doctor.trace.collectives import OTHER
from doctor.trace.events import EventArrays, Timeline
from doctor.trace.intervals import Spans, difference, union, union_of
from doctor.trace.kinds import SHARDING_OP


def outside_comm(ho: EventArrays, comm: EventArrays) -> Spans:
    """The host ops' time outside the communication ops of their own thread: an op inside one
    (DDP's reducer dividing a gradient inside ``torch::distributed::reducer::mul_out``) is
    communication's work, while a gloo thread's collective leaves the training thread's compute
    beside it as it is."""
    plain = ho.attrs["comm"] == 0
    if not len(comm) or "tid" not in comm.attrs:
        return union(ho.start[plain], ho.end[plain])
    parts = []
    for tid in np.unique(ho.attrs["tid"][plain]):
        mine = plain & (ho.attrs["tid"] == tid)
        theirs = comm.attrs["tid"] == tid
        ops = union(ho.start[mine], ho.end[mine])
        parts.append(difference(ops, union(comm.start[theirs], comm.end[theirs]))
                     if theirs.any() else ops)
    return union_of(*parts) if parts else union(ho.start[plain], ho.end[plain])


#: Host ops that are a backend's own work on its threads.
BACKEND_WORK = ("gloo:", "mpi:", "ucc:")
#: A gap this long (us) with no op of its own on the thread that issued a collective still in
#: flight is the thread waiting for it (shorter ones: Python between ops).
WAIT_US = 50.0
#: Host ops of backward (the autograd engine's own, around each node it runs).
BACKWARD_OP = "autograd::engine::evaluate_function"
#: The ops of functional collectives (torch.distributed._functional_collectives: DTensor's tensor
#: parallel layers, compiled graphs), around the c10d call each issues.
FUNCTIONAL_OP = ("_c10d_functional::", "c10d_functional::")
FORWARD, BACKWARD, OPTIMIZER = "forward", "backward", "optimizer"
#: How far back among the sharding ops that start before a call to look for one around it.
NESTING = 64


def named(ops: EventArrays, names: list[str], test: Callable[[str], bool]) -> np.ndarray:
    """A mask of the ops of ``ops`` (with a ``name`` column of codes into ``names``) whose name
    passes ``test`` (each distinct name tested once)."""
    if not len(ops) or "name" not in ops.attrs:
        return np.zeros(len(ops), dtype=bool)
    codes = ops.attrs["name"]
    distinct = np.unique(codes)
    passing = distinct[[test(names[int(c)]) for c in distinct]]
    return np.isin(codes, passing)


def issued(work: EventArrays, calls: EventArrays) -> np.ndarray:
    """For each backend's work (gloo's thread reducing), the index in ``calls`` of the c10d
    call that enqueued it (-1: none before it): the calls and the work pair in order where
    their counts match, else each work goes with the last call that started before it."""
    if not len(calls):
        return np.full(len(work), -1, np.int64)
    if len(calls) == len(work):
        return np.arange(len(work), dtype=np.int64)
    return (np.searchsorted(calls.start, work.start, side="right") - 1).astype(np.int64)


def phases(at: np.ndarray, backward: Spans, optimizer: Spans) -> list[str]:
    """The phase of the step at each host time: in the optimizer's step; in backward: from the
    first autograd node a step evaluates (``backward``: their spans) to its optimizer's step
    (the engine's final callbacks, where DDP and FSDP finish their reductions, included; to
    the node's end where no optimizer step follows); else forward."""
    regions = backward_regions(backward, optimizer)
    in_opt, in_back = inside(optimizer, at), inside(regions, at)
    return [OPTIMIZER if o else BACKWARD if b else FORWARD
            for o, b in zip(in_opt.tolist(), in_back.tolist(), strict=True)]


def backward_regions(backward: Spans, optimizer: Spans) -> Spans:
    """From each first autograd node after an optimizer step (or the trace's start) to the
    next optimizer step's start (or the last node's end)."""
    b_start, b_end = backward
    if not b_start.size:
        return backward
    o_start, o_end = optimizer
    cuts = np.concatenate(([-np.inf], o_end))  # a region starts after each optimizer step
    starts, ends = [], []
    for lo, hi in zip(cuts.tolist(), [*o_start.tolist(), np.inf], strict=True):
        inside = (b_start >= lo) & (b_start < hi)
        if inside.any():
            starts.append(float(b_start[inside].min()))
            ends.append(hi if np.isfinite(hi) else float(b_end[inside].max()))
    return union(np.array(starts), np.array(ends))


def inside(spans: Spans, at: np.ndarray) -> np.ndarray:
    """Whether each time of ``at`` falls in one of ``spans`` (disjoint, sorted)."""
    s, e = spans
    if not s.size:
        return np.zeros(len(at), dtype=bool)
    i = np.searchsorted(s, at, side="right") - 1
    return (i >= 0) & (e[np.maximum(i, 0)] >= at)


def units(at: np.ndarray, sharding: EventArrays, names: list[str]
          ) -> tuple[list[str], list[str], list[bool], np.ndarray]:
    """At each host time, the sharding library whose hook was running (``FSDP2``, ``FSDP``, or
    "" for none), the unit it named (``FSDP::all_gather (layers.3)``: ``layers.3``; ""), and
    whether one of the hooks around it was a prefetch (``FSDP::forward_prefetch for layers.3``,
    ``FullyShardedDataParallel._pre_backward_prefetch``): the unit's gather issued ahead of
    its own hook, while another unit was still to compute; and the time of the outermost hook
    around it (``FSDP::pre_backward (layers.3)``: its copies in and out with its gathers), shared
    equally by the collectives issued inside it (0: none around it)."""
    owners, unit_names, ahead, hook = [], [], [], []
    starts, ends = sharding.start, sharding.end
    codes = sharding.attrs.get("name", np.empty(0, np.int64))
    for t in at.tolist():
        k = int(np.searchsorted(starts, t, side="right")) - 1
        found, prefetch, outer = "", False, -1
        for j in range(k, max(k - NESTING, -1), -1):  # the innermost around it: latest start
            if ends[j] >= t:
                name = names[int(codes[j])]
                found = found or name
                prefetch = prefetch or PREFETCH in name.lower()
                outer = j
        owners.append(owner(found))
        unit_names.append(unit_of(found))
        ahead.append(prefetch)
        hook.append(outer)
    outers = np.array(hook, dtype=np.int64)
    shared = np.zeros(len(outers))
    around = outers >= 0
    if around.any():
        held, counts = np.unique(outers[around], return_counts=True)
        per_call = (ends[held] - starts[held]) * 1e-6 / counts
        shared[around] = per_call[np.searchsorted(held, outers[around])]
    return owners, unit_names, ahead, shared


#: The word FSDP's prefetching hooks carry in their annotations (FSDP2 and FSDP1).
PREFETCH = "prefetch"


def owner(name: str) -> str:
    """The sharding library of one of its annotations (kinds.SHARDING_OP): FSDP2's are
    ``FSDP::...``/``fsdp::...``, FSDP1's ``FullyShardedDataParallel._...``."""
    low = name.lower()
    if low.startswith("fsdp::"):
        return "FSDP2"
    return "FSDP" if low.startswith("fullyshardeddataparallel.") else ""


def unit_of(name: str) -> str:
    """The unit an FSDP2 annotation names (``FSDP::pre_forward (layers.3)``: ``layers.3``;
    ``FSDP::all_gather (0) [pg=2]``: ``0``); the root's has none: "(root)" where the annotation
    is a unit's (``FSDP::all_gather``), else ""."""
    if name.endswith("]") and " [" in name:
        name = name[:name.rindex(" [")]
    if name.endswith(")") and " (" in name:
        return name[name.rindex(" (") + 2:-1]
    return "(root)" if name.startswith(("FSDP::all_gather", "FSDP::post_backward_reduce",
                                        "FSDP::pre_", "FSDP::post_")) else ""


def where(ops: EventArrays, mask: np.ndarray) -> EventArrays:
    """The events of ``ops`` where ``mask`` holds."""
    return EventArrays(ops.start[mask], ops.end[mask], {k: v[mask] for k, v in ops.attrs.items()})


def outermost(ops: EventArrays) -> EventArrays:
    """The communication ops not inside another on the same thread (``record_param_comms``
    around ``gloo:all_reduce`` is one collective), keeping what the inner one knows."""
    tid = ops.attrs["tid"]
    keep = np.ones(len(ops), dtype=bool)
    attrs = {k: v.copy() for k, v in ops.attrs.items()}
    open_at: dict[int, int] = {}
    for i in range(len(ops)):
        j = open_at.get(int(tid[i]))
        if j is not None and ops.end[j] >= ops.end[i]:
            keep[i] = False
            for name in ("coll", "bytes", "group"):
                if attrs[name][j] <= 0 < attrs[name][i]:
                    attrs[name][j] = attrs[name][i]
            continue
        open_at[int(tid[i])] = i
    return where(EventArrays(ops.start, ops.end, attrs), keep)


def backend_pairs(t: Timeline) -> tuple[EventArrays, EventArrays, np.ndarray]:
    """The c10d calls that name a collective (outermost, not FSDP's hooks), the backends'
    work (``gloo:all_reduce`` on its threads) that names one, and for each work the index of
    the call that enqueued it (-1: none; doctor.trace.comm_context.issued)."""
    ops = t.comm_ops
    names = [t.names[n] for n in ops.attrs.get("name", np.empty(0, np.int64))]
    work = np.array([n.startswith(BACKEND_WORK) for n in names], dtype=bool)
    sharding = np.array([n.lower().startswith(SHARDING_OP) for n in names], dtype=bool)
    calls = outermost(where(ops, ~work & ~sharding))
    calls = where(calls, calls.attrs["coll"] != OTHER)  # c10d's wait() and the like move nothing
    done = where(ops, work)
    done = where(done, done.attrs["coll"] != OTHER)
    return calls, done, issued(done, calls)


def waits(t: Timeline) -> EventArrays:
    """The issuing thread waiting for its collectives: from each c10d call's end to the end of
    the backend's work it enqueued, the gaps of ``WAIT_US`` or more in which that thread runs
    no op of its own (``work.wait()``, a synchronous collective: time that an op around the
    call, an autograd node's or a custom Function's, would otherwise count as compute). Work
    recorded on the issuing thread itself (``on_issuing_thread``: gloo's sends and receives)
    is in flight while the thread goes on: only a gap that ends as it completes is a wait for
    it (the thread's Python between ops meanwhile is not)."""
    calls, done, by = backend_pairs(t)
    found = by >= 0
    if not found.any():
        return EventArrays(np.empty(0), np.empty(0), {"tid": np.empty(0, np.int64)})
    tids = calls.attrs["tid"][by[found]]
    own = done.attrs["tid"][found] == tids if "tid" in done.attrs else \
        np.zeros(len(tids), dtype=bool)
    lo, hi = calls.end[by[found]], done.end[found]
    hi = np.maximum(hi, lo)
    ho = t.host_ops
    starts, ends, out_tid = [], [], []
    for tid in np.unique(tids).tolist():
        mine = tids == tid
        ops = leaves(ho, tid)
        gaps = difference(union(lo[mine & ~own], hi[mine & ~own]), ops)
        own_gaps = difference(union(lo[mine & own], hi[mine & own]), ops)
        done_at = np.sort(hi[mine & own])
        at = np.searchsorted(done_at, own_gaps[1] - WAIT_US, side="left")
        ending = (at < len(done_at)) & \
            (done_at[np.minimum(at, len(done_at) - 1)] <= own_gaps[1] + WAIT_US)
        gaps = union_of(gaps, (own_gaps[0][ending], own_gaps[1][ending]))
        long = (gaps[1] - gaps[0]) >= WAIT_US
        starts.append(gaps[0][long])
        ends.append(gaps[1][long])
        out_tid.append(np.full(int(long.sum()), tid, np.int64))
    order = np.argsort(np.concatenate(starts), kind="stable")
    return EventArrays(np.concatenate(starts)[order], np.concatenate(ends)[order],
                       {"tid": np.concatenate(out_tid)[order]})


def on_issuing_thread(t: Timeline) -> np.ndarray:
    """A mask over the communication ops: a backend's work recorded on the thread that issued
    it, from the call to its completion, while that thread goes on (gloo's sends and receives,
    whose ``gloo:send`` spans the next micro-batch's forward on the training thread). Where the
    thread blocks for it instead, ``waits`` finds the gaps."""
    ops = t.comm_ops
    mask = np.zeros(len(ops), dtype=bool)
    if not len(ops) or "name" not in ops.attrs or "tid" not in ops.attrs:
        return mask
    names = [t.names[n] for n in ops.attrs["name"]]
    work = np.array([n.startswith(BACKEND_WORK) for n in names], dtype=bool)
    work &= ops.attrs["coll"] != OTHER
    calls, _, _ = backend_pairs(t)
    if not len(calls):
        return mask
    index = np.flatnonzero(work)
    by = issued(where(ops, work), calls)
    found = by >= 0
    same = found & (ops.attrs["tid"][index] == calls.attrs["tid"][np.maximum(by, 0)])
    mask[index[same]] = True
    return mask


def leaves(ho: EventArrays, tid: int) -> Spans:
    """The spans of the ops of thread ``tid`` that hold no other op but communication's (the
    work itself, not the ops around it: an op that issued a collective and did nothing else is
    taken as working beside it, one that holds other ops too as waiting between them)."""
    mine = np.flatnonzero((ho.attrs["tid"] == tid) & (ho.attrs["comm"] == 0))
    s, e = ho.start[mine], ho.end[mine]
    leaf = np.ones(len(mine), dtype=bool)
    leaf[:-1] = s[1:] >= e[:-1]  # sorted by start: the next op is inside, or after it
    return union(s[leaf], e[leaf])


def with_waits(t: Timeline, blocking: bool = False) -> EventArrays:
    """The communication ops and the waits for them (``waits``), by start, with their thread;
    ``blocking``: only what holds its thread (``on_issuing_thread`` left out: the thread's own
    ops beside such work are its compute)."""
    w = waits(t)
    ops = t.comm_ops
    if blocking:
        ops = where(ops, ~on_issuing_thread(t))
    start = np.concatenate([ops.start, w.start])
    order = np.argsort(start, kind="stable")
    return EventArrays(start[order], np.concatenate([ops.end, w.end])[order],
                       {"tid": np.concatenate([ops.attrs["tid"], w.attrs["tid"]])[order]})
