"""Where each collective of a trace was issued from: the host time of its call, and around it
the step's phase (forward, backward, optimizer) and the sharding unit whose hook issued it; and
the host ops' time outside communication (what can hide a collective)."""

from __future__ import annotations

import numpy as np

from doctor.trace.events import EventArrays
from doctor.trace.intervals import Spans, difference, union, union_of


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
