"""What each collective of a trace moved: its kind, its message's bytes, the size of its group,
and from its time the algorithm and bus bandwidth, as nccl-tests define them.

A collective's message comes from, in order:

- the arguments Kineto puts on the NCCL kernel itself in newer traces (``Collective name``,
  ``In msg nelems``, ``Out msg nelems``, ``dtype``, ``Group size``);
- the host op that launched it (``record_param_comms`` with the same arguments, or a
  ``nccl:all_reduce``-style annotation whose ``Input Dims`` and ``Input type`` give the tensors);
- for a kernel with neither, its name gives the kind (``ncclKernel_AllReduce_RING_LL_Sum_float``)
  and the bytes stay unknown.

The message size is the one nccl-tests report: the buffer all-reduced, broadcast or reduced; the
whole gathered output of an all-gather and the whole input of a reduce-scatter or all-to-all.
Bus bandwidth is the algorithm bandwidth (bytes over time) times the share of the message each
rank's link carries: ``2(n-1)/n`` for an all-reduce, ``(n-1)/n`` for all-gather, reduce-scatter
and all-to-all, 1 for broadcast, reduce and point-to-point.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any, Protocol

from doctor.trace.typed_events import count


class ArgsLike(Protocol):
    """An event's ``args`` as the analysis reads them: a dict, or a typed record of them
    (doctor.trace.typed_events.Args)."""

    def get(self, key: str, default: Any = None, /) -> Any: ...

    def __contains__(self, key: str, /) -> bool: ...

#: Kinds of collective (codes in integer columns, doctor.trace.events).
COLLECTIVES = ("other", "allreduce", "allgather", "reducescatter", "alltoall", "broadcast",
               "reduce", "sendrecv", "barrier")
OTHER, SENDRECV = 0, 7
_KIND = {name: code for code, name in enumerate(COLLECTIVES)}
_ALIASES = {
    "all_reduce": "allreduce", "allreduce_coalesced": "allreduce",
    "all_reduce_coalesced": "allreduce", "allreduce_base": "allreduce",
    "all_gather": "allgather", "_all_gather_base": "allgather", "all_gather_base": "allgather",
    "allgather_base": "allgather", "all_gather_into_tensor": "allgather",
    "allgather_into_tensor_coalesced": "allgather", "allgather_coalesced": "allgather",
    "reduce_scatter": "reducescatter", "_reduce_scatter_base": "reducescatter",
    "reduce_scatter_base": "reducescatter", "reduce_scatter_tensor": "reducescatter",
    "reduce_scatter_tensor_coalesced": "reducescatter",
    "all_to_all": "alltoall", "alltoall_base": "alltoall", "all_to_all_single": "alltoall",
    "alltoallv": "alltoall", "send": "sendrecv", "recv": "sendrecv", "sendrecv": "sendrecv",
    "recv_any_source": "sendrecv", "batch_isend_irecv": "sendrecv", "monitored_barrier": "barrier",
    "_allgather_base": "allgather", "_reduce_scatter_base_": "reducescatter",
}
_KERNEL = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)", re.IGNORECASE)
_KERNEL_KINDS = {"allreduce": "allreduce", "allgather": "allgather",
                 "reducescatter": "reducescatter", "broadcast": "broadcast", "reduce": "reduce",
                 "sendrecv": "sendrecv", "send": "sendrecv", "recv": "sendrecv"}
#: Bytes of an element, by the names traces give dtypes (``dtype`` and ``Input type``).
DTYPE_SIZE = {
    "float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "c10::bfloat16": 2,
    "c10::half": 2, "double": 8, "float64": 8, "long": 8, "long int": 8, "int64": 8, "int": 4,
    "int32": 4, "short": 2, "int16": 2, "char": 1, "signed char": 1, "unsigned char": 1,
    "byte": 1, "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "complexfloat": 8, "complexdouble": 16,
}


def kind_code(name: Any) -> int:
    """The code of a collective's kind from the name a trace gives it (``allreduce``,
    ``nccl:_all_gather_base``, ``gloo:all_reduce``, ``c10d::allreduce_``), OTHER if unknown
    (or not a string: a trace written by another tool)."""
    if not name or not isinstance(name, str):
        return OTHER
    low = name.lower().strip()
    for prefix in ("nccl:", "gloo:", "c10d::", "c10d:", "mpi:", "ucc:"):
        if low.startswith(prefix):
            low = low[len(prefix):]
            break
    low = low.rstrip("_")
    low = _ALIASES.get(low, low)
    return _KIND.get(low, OTHER)


def kernel_kind_code(kernel_name: str) -> int:
    """The kind of an NCCL/RCCL kernel from its name (``ncclKernel_AllReduce_RING_LL_Sum_float``,
    ``ncclDevKernel_AllGather_RING_LL``)."""
    m = _KERNEL.search(kernel_name)
    if not m:
        return OTHER
    return _KIND.get(_KERNEL_KINDS.get(m.group(1).lower(), ""), OTHER)


def _size(dtype: Any) -> int | None:
    return DTYPE_SIZE.get(str(dtype).strip().lower()) if dtype is not None else None


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def message_bytes(kind: int, args: ArgsLike) -> int | None:
    """A collective's message size in bytes from Kineto's ``In/Out msg nelems`` and ``dtype``
    (None where they are absent)."""
    size = _size(args.get("dtype"))
    n_in, n_out = _int(args.get("In msg nelems")), _int(args.get("Out msg nelems"))
    if size is None or (n_in is None and n_out is None):
        return None
    if kind == _KIND["allgather"]:
        n = n_out if n_out is not None else n_in
    else:
        n = n_in if n_in is not None else n_out
    return None if n is None else n * size


def tensors_bytes(dims: Any, types: Any) -> int | None:
    """The message of a collective from the tensors its op's ``Input Dims`` and ``Input type``
    record: the largest of them (None: no tensor). The largest is the message whatever the
    kind: the tensor all-reduced, the whole output of an all-gather (``_all_gather_base(out,
    in)``), the whole input of a reduce-scatter."""
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    largest = None
    for shape, dtype in zip(dims, types, strict=False):
        size = _size(dtype)
        if size is None or not isinstance(shape, list) or not shape or \
                not all(isinstance(x, int) for x in shape):
            continue
        nbytes = math.prod(shape) * size
        largest = nbytes if largest is None else max(largest, nbytes)
    return largest


def bus_factor(kind: int, group: int) -> float:
    """The share of a collective's message each rank's link carries (nccl-tests' bus bandwidth
    over algorithm bandwidth)."""
    if kind in (_KIND["broadcast"], _KIND["reduce"], _KIND["sendrecv"]):
        return 1.0
    if group <= 1:
        return math.nan  # a group of one: no link carries anything
    if kind == _KIND["allreduce"]:
        return 2.0 * (group - 1) / group
    if kind in (_KIND["allgather"], _KIND["reducescatter"], _KIND["alltoall"]):
        return (group - 1) / group
    return 1.0


def collective_args(name: str, args: ArgsLike) -> tuple[int, int, int]:
    """(kind code, message bytes or -1, group size or -1: unknown, or not a real size) of a
    host op or kernel from its name and arguments."""
    kind = kind_code(args.get("Collective name")) or kind_code(name) or kernel_kind_code(name)
    nbytes = message_bytes(kind, args)
    if nbytes is None and "Input Dims" in args:
        nbytes = tensors_bytes(args.get("Input Dims"), args.get("Input type"))
    return kind, count(nbytes), count(_int(args.get("Group size")))


def bandwidths(kind: Sequence[int], nbytes: Sequence[float], seconds: Sequence[float],
               group: Sequence[int]) -> list[tuple[float, float]]:
    """(algorithm, bus) bandwidth in bytes/s of each collective (nan where unknown)."""
    out = []
    for k, b, s, g in zip(kind, nbytes, seconds, group, strict=True):
        if b is None or b < 0 or s <= 0 or (b != b):
            out.append((math.nan, math.nan))
            continue
        alg = float(b) / float(s)
        out.append((alg, alg * bus_factor(int(k), int(g)) if g and g > 0 else math.nan))
    return out

