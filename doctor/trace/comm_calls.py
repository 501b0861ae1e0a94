"""One row per collective of a trace (doctor.trace.collectives says what each moved): its kind,
span, bytes, group size, how much of it no compute overlaps, and its bandwidths."""

from __future__ import annotations

import numpy as np
import pandas as pd

from doctor.trace.collectives import COLLECTIVES, OTHER, SENDRECV, bandwidths
from doctor.trace.comm_context import (
    BACKWARD_OP,
    FUNCTIONAL_OP,
    backend_pairs,
    inside,
    named,
    outside_comm,
    phases,
    units,
    where,
    with_waits,
)
from doctor.trace.events import EventArrays, Timeline
from doctor.trace.intervals import overlap_per_span, union
from doctor.trace.kinds import K_COMM, SHARDING_OP
from doctor.trace.ops import last_of, look_up

#: Functional collectives' ops that issue none: the wait for one, its autograd wrapper.
FUNCTIONAL_NOT_ISSUING = ("::wait_tensor", "::_wrap_tensor_autograd")
CALL_COLUMNS = ("kind", "start_us", "end_us", "seconds", "bytes", "group", "exposed_s",
                "alg_bytes_s", "bus_bytes_s", "on_gpu", "phase", "owner", "unit", "prefetched",
                "hook_s", "compute_before_s", "compute_after_s", "functional")


def collective_calls(t: Timeline) -> pd.DataFrame:
    """One row per collective of the trace: its kind, span, bytes (nan: unknown), group size,
    the part of it no compute overlaps (``exposed_s``), its bandwidths, and where it was issued
    from (doctor.trace.comm_context): the step's ``phase`` (forward, backward, optimizer), and
    the sharding library (``owner``: FSDP2, FSDP or "") and ``unit`` whose hook issued it,
    whether that hook was a prefetch (``prefetched``), its share of the time of the outermost
    sharding hook around it (``hook_s``: FSDP's copies in and out, its waits), and the compute
    between it and the
    collectives of its kind before and after it in the same phase (``compute_before_s``,
    ``compute_after_s``: what it could run beside, issued one unit earlier or, issued ahead
    already, not blocking its thread), and whether a functional collective issued it
    (``functional``: ``_c10d_functional::all_reduce`` around it, as DTensor's tensor parallel
    layers and compiled graphs issue them; c10d's own calls, DDP's and FSDP's, are not).

    On a GPU trace the collectives are the NCCL kernels (the host ops only enqueue them), their
    message from their own arguments or else from the host op that launched them, issued when
    that op launched them; compute is the other kernels. On a CPU trace they are the host's
    communication ops (a backend's work on its own thread, of the kind the c10d call that
    enqueued it names: gloo reduce-scatters by all-reducing), compute the other host ops outside
    the communication ops of their own thread (FSDP's hooks are communication's) and outside
    its waits for them (doctor.trace.comm_context.waits)."""
    gpu = len(t.comm_kernels) > 0
    sharding = named(t.comm_ops, t.names, lambda n: n.lower().startswith(SHARDING_OP))
    if gpu:
        c = t.comm_kernels
        kind, nbytes, group = (c.attrs[k].copy() for k in ("coll", "bytes", "group"))
        at = _bytes_from_launchers(t, kind, nbytes, group)
        k = t.kernels
        compute = union(k.start[k.attrs["kind"] != K_COMM], k.end[k.attrs["kind"] != K_COMM])
    else:
        c, at = _backend_work(t)
        kind, nbytes, group = (c.attrs[k] for k in ("coll", "bytes", "group"))
        compute = outside_comm(t.host_ops, with_waits(t, blocking=True))
    if not len(c):
        return pd.DataFrame({col: pd.Series(dtype=float) for col in CALL_COLUMNS})
    world = t.meta.world_size
    group = np.where(group > 0, group, world if world else -1).astype(np.int64)
    seconds = (c.end - c.start) * 1e-6
    overlap = overlap_per_span(compute[0], compute[1], c.start, c.end) * 1e-6
    sizes = np.where(nbytes >= 0, nbytes.astype(float), np.nan)
    bw = bandwidths(kind.tolist(), sizes.tolist(), seconds.tolist(), group.tolist())
    backward = named(t.host_ops, t.names, lambda n: n.startswith(BACKWARD_OP))
    opt = t.optimizer_steps
    owners, unit_names, ahead, hook_s = units(at, where(t.comm_ops, sharding), t.names)
    phase = phases(at, union(t.host_ops.start[backward], t.host_ops.end[backward]),
                   union(opt.start, opt.end))
    functional = named(t.host_ops, t.names, lambda n: n.startswith(FUNCTIONAL_OP)
                       and not n.endswith(FUNCTIONAL_NOT_ISSUING))
    return pd.DataFrame({
        "kind": [COLLECTIVES[int(x)] for x in kind], "start_us": c.start, "end_us": c.end,
        "seconds": seconds, "bytes": sizes, "group": group,
        "exposed_s": np.maximum(seconds - overlap, 0.0),
        "alg_bytes_s": [a for a, _ in bw], "bus_bytes_s": [b for _, b in bw], "on_gpu": gpu,
        "phase": phase, "owner": owners, "unit": unit_names, "prefetched": ahead,
        "hook_s": hook_s,
        **compute_beside(kind, phase, c.start, c.end, compute),
        "functional": inside(union(t.host_ops.start[functional], t.host_ops.end[functional]),
                             at),
    })


def compute_beside(kind: np.ndarray, phase: list[str], start: np.ndarray, end: np.ndarray,
                   compute: tuple[np.ndarray, np.ndarray]) -> dict[str, np.ndarray]:
    """Per collective, the compute (s) between it and the previous collective of its kind
    (``compute_before_s``: its end to this one's start) and the next (``compute_after_s``),
    where the calls of that span are all of its phase (a run of calls of one phase: in
    forward, the previous unit's compute before a unit's all-gather; in backward, the later
    unit's gradients); 0 for the first (last) of a run."""
    n = len(start)
    spans = {name: (np.zeros(n), np.zeros(n)) for name in ("compute_before_s", "compute_after_s")}
    last: dict[int, tuple[int, int]] = {}  # kind -> (its latest call, the phase's run then)
    previous, run = "", 0  # a run: calls of one phase in a row
    for i in np.argsort(start, kind="stable").tolist():
        run += phase[i] != previous
        j, its_run = last.get(int(kind[i]), (-1, -1))
        if its_run == run and end[j] < start[i]:
            spans["compute_before_s"][0][i], spans["compute_before_s"][1][i] = end[j], start[i]
            spans["compute_after_s"][0][j], spans["compute_after_s"][1][j] = end[j], start[i]
        last[int(kind[i])], previous = (i, run), phase[i]
    return {name: overlap_per_span(compute[0], compute[1], lo, hi) * 1e-6
            for name, (lo, hi) in spans.items()}


def _backend_work(t: Timeline) -> tuple[EventArrays, np.ndarray]:
    """The host's collectives that do the work, and the host time each was issued at: a
    backend's own work (``gloo:all_reduce`` on its threads) where the trace has it, of the kind
    of the c10d call that enqueued it on the training thread (issued when that call started);
    else every communication op that names a collective, issued when it started."""
    calls, done, by = backend_pairs(t)
    if not len(done):
        return calls, calls.start
    if not len(calls):  # the backend's work alone (a trace without c10d's calls)
        return done, done.start
    found = by >= 0
    at = np.where(found, calls.start[np.maximum(by, 0)], done.start)
    first = np.maximum(by, 0)
    issuer = calls.attrs["coll"][first]
    done.attrs["coll"][:] = np.where(found & (issuer != OTHER), issuer, done.attrs["coll"])
    # the call's tensors give the message where it has them (an all-gather's output; the
    # backend's work may show only this rank's part)
    sized = calls.attrs["bytes"][first]
    done.attrs["bytes"][:] = np.where(found, np.maximum(sized, done.attrs["bytes"]),
                                      done.attrs["bytes"])
    return done, at


def _bytes_from_launchers(t: Timeline, kind: np.ndarray, nbytes: np.ndarray,
                          group: np.ndarray) -> np.ndarray:
    """Fill in a kernel's unknown kind, bytes and group from the communication op on the host
    that launched it (the runtime call of the same correlation falls inside it); the host time
    each kernel was launched at (its own start where the trace has no launch for it)."""
    # NCCL runs all-to-all (and scatter, gather) as grouped sends and receives: a SendRecv
    # kernel's kind is the launching op's where that names one
    generic = (kind == OTHER) | (kind == SENDRECV)
    kernels = t.comm_kernels
    at = kernels.start.copy()
    if not len(t.runtime):
        return at
    rt, ops = t.runtime, t.comm_ops
    corr = rt.attrs["corr"]
    launches = look_up(last_of(corr[corr >= 0], np.flatnonzero(corr >= 0)),
                       kernels.attrs["corr"])
    at = np.where(launches >= 0, rt.start[np.maximum(launches, 0)], at)
    unknown = np.flatnonzero((nbytes < 0) | generic | (group < 0))
    if not len(unknown) or not len(ops):
        return at
    launch = launches[unknown]
    o_start, o_end, o_tid = ops.start, ops.end, ops.attrs["tid"]
    o_bytes, o_coll, o_group = (ops.attrs[k].tolist() for k in ("bytes", "coll", "group"))
    # per thread, its ops (sorted by start) and the latest end among each one and those before
    threads = {}
    for tid in np.unique(o_tid).tolist():
        mine = np.flatnonzero(o_tid == tid)
        threads[tid] = (o_start[mine], o_end[mine].tolist(),
                        np.maximum.accumulate(o_end[mine]).tolist(), mine.tolist())
    for i, j in zip(unknown.tolist(), launch.tolist(), strict=True):
        if j < 0 or int(rt.attrs["tid"][j]) not in threads:
            continue
        starts, ends, reach, index = threads[int(rt.attrs["tid"][j])]
        when = float(rt.start[j])
        k = int(np.searchsorted(starts, when, side="right")) - 1
        while k >= 0 and reach[k] >= when:  # the ops that contain it, the innermost first
            if ends[k] >= when:
                o = index[k]
                if nbytes[i] < 0 and o_bytes[o] >= 0:
                    nbytes[i] = o_bytes[o]
                if generic[i] and o_coll[o] != OTHER:
                    kind[i] = o_coll[o]
                    generic[i] = False
                if group[i] < 0 and o_group[o] > 0:
                    group[i] = o_group[o]
            k -= 1
    return at
