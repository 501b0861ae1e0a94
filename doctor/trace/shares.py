"""Split each profiled step's wall time into exclusive category seconds.

Every instant of a step window is given to exactly one category, so the parts add up to the step's
``dur_s``. The policy, in priority order (the first that holds at an instant wins):

On a GPU step (the trace has kernels, copies or memsets):

1. ``compute``: the GPU runs compute work: kernels other than collectives, device-to-device
   copies and memsets.
2. ``communication``: the GPU runs collective kernels (NCCL/RCCL) with no compute beside them:
   exposed communication.
3. ``transfer``: the GPU runs a host<->device copy with no kernel beside it: exposed transfer.
4. The GPU is idle; the host is
   a. in ``DataLoader.__next__``: ``input`` (the trace alone cannot split io/decode/preprocess);
   b. in a collective op (``nccl:*``, ``gloo:*``, ``c10d::*``): ``communication``;
   c. in any other recorded op: ``compute`` (the host feeding the GPU counts as compute, as in
      DESIGN.md: a launch-bound step is compute-bound on the host side). A blocking copy call
      (``cudaMemcpyAsync`` to pageable memory) with the GPU idle lands here too: the copy itself
      shows on the GPU as a memcpy; the rest of the call is the host waiting for earlier work;
   d. in nothing recorded (Python between ops, logging, ...): ``other``.

On a CPU step (no GPU activity in the trace): ``input`` while the DataLoader is waited for, then
``communication`` for collective ops not hidden behind other host ops (e.g. gloo all-reduce on a
background thread while the main thread idles), then ``compute`` for recorded ops, then ``other``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from doctor.categories import TRACE_CATEGORIES
from doctor.trace.intervals import EMPTY, Spans, difference, length

__all__ = ["EXCLUSIVE_COLUMNS", "SHARE_CATEGORIES", "StepSpans", "category_seconds", "partition"]

#: The categories a trace can tell apart, in the order of the columns of category_seconds.
SHARE_CATEGORIES: tuple[str, ...] = TRACE_CATEGORIES
#: Step-frame columns holding the exclusive seconds of each category.
EXCLUSIVE_COLUMNS: dict[str, str] = {c: f"excl_{c}_s" for c in SHARE_CATEGORIES}


@dataclass(frozen=True)
class StepSpans:
    """The interval sets of one step window, already clipped to it (microseconds)."""

    window: Spans
    gpu_compute: Spans = EMPTY  # non-collective kernels, DtoD copies, memsets
    gpu_comm: Spans = EMPTY  # collective kernels
    gpu_copy: Spans = EMPTY  # host<->device (and other non-DtoD) copies
    dataloader: Spans = EMPTY
    host_comm: Spans = EMPTY  # collective ops on the host
    host_ops: Spans = EMPTY  # every recorded host op
    host_ops_not_comm: Spans = EMPTY  # host ops that are not collectives
    gpu: bool = True


def partition(spans: StepSpans) -> dict[str, float]:
    """Exclusive seconds per category (SHARE_CATEGORIES) for one step; they sum to its length."""
    rest = spans.window
    out: dict[str, float] = dict.fromkeys(SHARE_CATEGORIES, 0.0)

    def take(category: str, cover: Spans) -> None:
        nonlocal rest
        if rest[0].size == 0 or cover[0].size == 0:
            return
        left = difference(rest, cover)
        out[category] += length(rest) - length(left)
        rest = left

    if spans.gpu:
        take("compute", spans.gpu_compute)
        take("communication", spans.gpu_comm)
        take("transfer", spans.gpu_copy)
        take("input", spans.dataloader)
        take("communication", spans.host_comm)
        take("compute", spans.host_ops)
    else:
        take("input", spans.dataloader)
        take("communication", difference(spans.host_comm, spans.host_ops_not_comm))
        take("compute", spans.host_ops)
    out["other"] += length(rest)
    return {k: v / 1e6 for k, v in out.items()}


def category_seconds(step_frame: pd.DataFrame) -> pd.DataFrame:
    """Seconds per category for each row of a step frame (doctor.trace.steps.trace_step_frame).

    Columns ``input, transfer, compute, communication, other``, same index; each row sums to the
    step's ``dur_s``. A frame without the exclusive columns (hand-made, or from an older version)
    is split from its totals with the same priorities, as well as totals allow.
    """
    if step_frame.empty:
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in SHARE_CATEGORIES},
                            index=step_frame.index)
    if all(col in step_frame for col in EXCLUSIVE_COLUMNS.values()):
        out = pd.DataFrame(
            {c: step_frame[col].astype("float64") for c, col in EXCLUSIVE_COLUMNS.items()},
            index=step_frame.index,
        )
        return out
    return _from_totals(step_frame)


def _col(frame: pd.DataFrame, name: str) -> np.ndarray:
    if name not in frame:
        return np.zeros(len(frame))
    return np.nan_to_num(frame[name].to_numpy(dtype="float64"), nan=0.0)


def _from_totals(frame: pd.DataFrame) -> pd.DataFrame:
    """Approximate the partition from per-step totals (no interval sets at hand)."""
    dur = _col(frame, "dur_s")
    gpu = (
        (frame["device"] == "cuda").to_numpy() if "device" in frame
        else np.zeros(len(frame), dtype=bool)
    )
    busy = _col(frame, "gpu_busy_s")
    comm_x = _col(frame, "comm_exposed_s")
    xfer_x = _col(frame, "transfer_exposed_s")
    remaining = dur.copy()

    def take(amount: np.ndarray) -> np.ndarray:
        nonlocal remaining
        got = np.clip(amount, 0.0, remaining)
        remaining = remaining - got
        return got

    compute_gpu = take(np.where(gpu, busy - comm_x - xfer_x, 0.0))
    comm = take(comm_x)
    transfer = take(np.where(gpu, xfer_x, 0.0))
    inp = take(_col(frame, "dataloader_s"))
    compute_host = take(_col(frame, "cpu_op_s"))
    return pd.DataFrame(
        {"input": inp, "transfer": transfer, "compute": compute_gpu + compute_host,
         "communication": comm, "other": remaining},
        index=frame.index,
    )
