"""Which host ops of a trace ran inside a torch.compile'd region, for the op table
(doctor.trace.ops).

torch.profiler marks each call of a compiled frame with a host event ``Torch-Compiled Region:
F/N`` (``Torch-Compiled Region`` alone before torch 2.3), F the frame and N which compilation
of it; what the compiled code runs nests inside it on the same thread: Inductor's generated code
(``## Call CompiledFxGraph <hash> ##``; its own time is the fused kernels', ``cpp_fused_*`` on a
CPU, the Triton kernels' launches on a GPU, which appear by name where the trace records them),
the ops it calls out to (``aten::mm``...), and AOTAutograd's ``CompiledFunction``. The
compiled backward runs later, from autograd, under AOTAutograd's ``CompiledFunctionBackward``:
a region too (``backward``: the trace does not say whose). An op outside every region ran
eagerly: in a compiled job, the code around and between the graphs
(graph breaks), and the parts never compiled.
"""

from __future__ import annotations

import re

import numpy as np

from doctor.trace.events import Timeline

REGION = "Torch-Compiled Region"
BACKWARD = "CompiledFunctionBackward"
#: Inductor's and AOTAutograd's own ops: the compiled code itself
COMPILED_CODE = re.compile(r"^## Call CompiledFxGraph|^cpp_fused_|^triton_|^CompiledFunction")
_REGION_ID = re.compile(r"(\d+/\d+)")


def is_region(name: str) -> bool:
    return name.startswith(REGION) or name == BACKWARD


def region_label(name: str) -> str:
    """``0/1`` of ``Torch-Compiled Region: 0/1`` (``compiled`` where the event names none),
    ``backward`` for the compiled backward."""
    if name == BACKWARD:
        return "backward"
    found = _REGION_ID.search(name)
    return found.group(1) if found else "compiled"


def is_compiled_code(name: str) -> bool:
    return bool(COMPILED_CODE.match(name))


def host_op_regions(t: Timeline) -> tuple[np.ndarray, list[str]]:
    """For each host op, the index (into the labels returned) of the compiled region it ran
    in, -1 for none; a region's own event counts as in it. Regions are found by their
    event's name; an op is in the latest region that began on its thread at or before it and
    ends at or after it."""
    host = t.host_ops
    out = np.full(len(host), -1, dtype=np.int64)
    if not len(host):
        return out, []
    names = t.names
    regional = np.fromiter((is_region(str(n)) for n in names), bool, len(names))
    if not regional.any():  # no compiled region in this trace (most): nothing more to read
        return out, []
    codes = host.attrs["name"]
    region = regional[codes]
    labels: list[str] = []
    label_of: dict[str, int] = {}
    label_code = np.full(len(names), -1, dtype=np.int64)
    for code in np.flatnonzero(regional):
        label = region_label(str(names[code]))
        label_code[code] = label_of.setdefault(label, len(labels))
        if label_code[code] == len(labels):
            labels.append(label)
    tid = host.attrs["tid"]
    for thread in np.unique(tid[region]):
        mine = np.flatnonzero(tid == thread)
        regions = mine[region[mine]]
        starts, ends = host.start[regions], host.end[regions]
        at = np.searchsorted(starts, host.start[mine], side="right") - 1
        inside = (at >= 0) & (host.end[mine] <= ends[np.maximum(at, 0)])
        out[mine[inside]] = label_code[codes[regions[at[inside]]]]
    return out, labels
