"""Tensor parallelism's fixes for its exposed collectives (the ``tensor`` role of
doctor.analyse.parallelism: a row-parallel layer's all-reduce of its output in forward, a
column-parallel layer's of its input gradient in backward, every layer, every step). Never DDP's
bucket or no_sync fixes, nor a BatchNorm fix: these collectives carry activations.

- data parallel instead, where the model and its optimizer state fit one device (the whole
  model's parameters, gradients and optimizer state, g times this rank's shards, beside the rest
  of its peak, where the memory probes measured them), for the same
  global batch: each of the g ranks computes every layer whole on 1/g of the batch, the same
  work a rank does now (every layer's 1/g on the whole batch); the activations' collectives are
  gone, DDP's all-reduce of the whole model's gradients comes (g times this rank's parameter
  bytes, where the memory probe measured them: a call's latency, the tensor-parallel calls'
  median time, per 25 MiB bucket, and 2(g-1)/g of the bytes over the link between the ranks
  where it is known, else at the bus bandwidth the tensor-parallel calls reached, which their
  small messages hold down; none of it hidden behind backward), the other collectives stay.
  DTensor's own host work goes too (its ops in the window: ``PythonSubclass``, the sharding
  propagation in Python beside each op, ``Redistribute``, the conversions to and from DTensor,
  the functional collectives' issuing; their self time a step, counted as compute in the
  step). Offered only where that makes the step faster; smaller matrix products on 1/g of the
  batch can run less efficiently, which it does not count;
- DTensor's own host work (the same ops), where it is 5 % of the step or more: compile the
  tensor-parallel model, which traces through DTensor once; on a CPU estimated as that host
  time off the step (compilation's fusions and its first steps not counted: the sample
  measured 1.36-1.69x against 1.39x), on a GPU none (host time costs the step only where the
  GPU waits for it);
- on a GPU, asynchronous tensor parallelism (torch.compile's micro-pipelined TP: each matrix
  product split so that its all-gather or reduce-scatter runs beside the other parts; needs
  sequence parallel styles and symmetric memory): no estimate (how much the products hide is
  not measured);
- where the calls are latency-bound (small messages, a round trip each): parallelise whole
  blocks, a column-parallel first layer and a row-parallel last one, and keep the small layers
  between them local, so that one all-reduce a block is left in each direction.
"""

from __future__ import annotations

import math

import pandas as pd

from doctor.analyse.memory import RankMemory
from doctor.analyse.parallelism import STATS_BYTES, TENSOR, Parallelism
from doctor.rules.comm_kinds import Exposed
from doctor.rules.window import speedup
from doctor.verdict import Fix

KIB = 1024
MIB = 2**20
DDP_BUCKET = 25 * 2**20  # DDP's default bucket_cap_mb
#: DTensor's own host work, as a share of the step, from which compiling it away is offered.
DISPATCH_SHARE = 0.05


def ddp_reduce_s(calls: pd.DataFrame, degree: int, param_bytes: float | None,
                 link_bytes_s: float | None) -> float | None:
    """DDP's all-reduce of the whole model's gradients (``degree`` times a rank's shards), in
    seconds a step: a latency (the tensor-parallel calls' median time) per bucket, and the bytes
    over the link (else at the bus bandwidth those calls reached). None: not sized."""
    if not param_bytes or degree < 2:
        return None
    whole = param_bytes * degree
    bus = link_bytes_s or (float(calls["bus_bytes_s"].median())
                           if "bus_bytes_s" in calls and calls["bus_bytes_s"].notna().any()
                           else 0.0)
    if not bus > 0:
        return None
    latency = float(calls["seconds"].median()) if link_bytes_s else 0.0
    return math.ceil(whole / DDP_BUCKET) * latency + 2 * (degree - 1) / degree * whole / bus


def whole_model_fits(memory: RankMemory | None, degree: int) -> tuple[bool, str]:
    """Whether the whole model's parameters, gradients and optimizer state (``degree`` times
    this rank's shards) fit beside the rest of its peak, and the words for it; where either is
    not measured, it is the user's to check."""
    static = memory.static_bytes if memory is not None else 0.0
    if memory is None or not static:
        return True, "the model, its gradients and optimizer state must fit one device"
    whole = static * degree
    words = (f"the model, its gradients and optimizer state take {whole / MIB:,.0f} MiB a rank "
             f"instead of {static / MIB:,.0f}")
    if memory.capacity_bytes and memory.peak_bytes:
        need = memory.peak_bytes - static + whole
        words += f", {need / MIB:,.0f} MiB at the peak of {memory.capacity_bytes / MIB:,.0f}"
        return need <= memory.capacity_bytes, words
    return True, words


def tensor_fixes(ex: Exposed, par: Parallelism | None, share: float, step_s: float,
                 memory: RankMemory | None, link_bytes_s: float | None = None,
                 dtensor_s: float = 0.0) -> list[Fix]:
    """The fixes for the critical rank's tensor-parallel collectives ``ex``; ``share``: the
    exposed communication's share of the step of ``step_s``; ``memory``: a rank's memory (its
    parameters' shards, with their gradients and optimizer state; None: not measured);
    ``link_bytes_s``: the link between the ranks (None: not known); ``dtensor_s``: DTensor's
    own host time a step (dtensor_host_s)."""
    calls = ex.of(TENSOR)
    if calls.empty:
        return []
    degree = (par.tensor_size if par is not None and par.tensor_size else 0) or ex.world
    per_step = len(calls) / ex.steps
    exposed = float(calls["exposed_s"].sum()) / ex.steps
    size = float(calls["bytes"].median()) if calls["bytes"].notna().any() else float("nan")
    said = (f"{per_step:g} collectives of activations a step"
            + (f" ({size / KIB:.0f} KiB median)" if size == size else "")
            + f", {exposed * 1e3:.1f} ms exposed")
    out = []
    tp_share = share * ex.share(TENSOR)
    compute = 1.0 - share
    param_bytes = memory.parts.get("parameters") if memory is not None else None
    fits, held = whole_model_fits(memory, degree)
    reduce = ddp_reduce_s(calls, degree, param_bytes, link_bytes_s)
    reduce = reduce / step_s if reduce is not None and step_s > 0 else None
    dispatch = min(dtensor_s / step_s, compute) if step_s > 0 else 0.0
    data_parallel = compute - dispatch + share - tp_share + (reduce or 0.0)  # a step of 1 now
    if degree > 1 and reduce is not None and fits and \
            speedup(1.0, 1.0 - data_parallel) >= 1.02:
        out.append(Fix(
            title="Data parallel instead of tensor parallel where the model fits one device",
            why=(f"{said}: tensor parallelism all-reduces activations at every layer, every "
                 f"step; data parallelism over the same {degree} ranks, for the same global "
                 f"batch, computes each layer whole on 1/{degree} of the batch (the same work "
                 f"a rank does now, {compute:.0%} of the step"
                 + (f", less DTensor's own host work, {dispatch:.0%}" if dispatch >= 0.01
                    else "")
                 + f") and all-reduces the gradients once a step ({reduce or 0:.0%} of the step "
                   "now, none of it hidden); " + held),
            code=("# no parallelize_module: each rank holds the whole model and 1/world of the "
                  "batch\nmodel = DistributedDataParallel(model)\n"
                  "loader = DataLoader(data, batch_size=batch // world,\n"
                  "                    sampler=DistributedSampler(data))"),
            estimated_speedup=speedup(1.0, 1.0 - data_parallel)))
    on_gpu = bool(calls["on_gpu"].any()) if "on_gpu" in calls else False
    if dispatch >= DISPATCH_SHARE:
        out.append(Fix(
            title=f"Compile the tensor-parallel model: DTensor's own host work is "
                  f"{dispatch:.0%} of the step",
            why=(f"DTensor's dispatch (the sharding propagation in Python beside each op), its "
                 f"redistributions and conversions take {dtensor_s * 1e3:.1f} ms of host time "
                 "a step, none of it the model's own work; torch.compile traces through "
                 "DTensor once, so the compiled step runs the local ops and collectives without "
                 "it" + (" (no estimate: on a GPU, host time costs the step only where the GPU "
                         "waits for it)" if on_gpu else
                         "; the estimate takes that host time off the step, on a CPU the "
                         "step's own (what compilation's fusions add, and its cost at the "
                         "first steps, are not counted)")),
            code=("parallelize_module(model, tp_mesh, plan)\n"
                  "model = torch.compile(model)  # after parallelize_module"),
            estimated_speedup=None if on_gpu else speedup(1.0, dispatch)))
    if on_gpu:
        out.append(Fix(
            title="Overlap the collectives with the matrix products (asynchronous tensor "
                  "parallel)",
            why=(f"{said}: with sequence parallel styles and torch.compile's micro-pipelined "
                 "tensor parallelism, each matrix product is split so that its all-gather or "
                 "reduce-scatter runs beside the other parts (no estimate: how much the products "
                 "hide is not measured)"),
            code=("from torch.distributed._symmetric_memory import enable_symm_mem_for_group\n"
                  "torch._inductor.config._micro_pipeline_tp = True\n"
                  "enable_symm_mem_for_group(tp_mesh.get_group().group_name)\n"
                  "model = torch.compile(model)")))
    if size == size and size < STATS_BYTES and per_step >= 4:
        out.append(Fix(
            title="Parallelise whole blocks, not each layer",
            why=(f"{said}: messages this small are latency-bound, a round trip each; a "
                 "column-parallel first layer and a row-parallel last layer per block, with the "
                 "layers between them local to each rank's shard, leave one all-reduce a block "
                 "in each direction"),
            code=('plan = {"mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel()}  '
                  "# a block's first and last\nparallelize_module(block, tp_mesh, plan)")))
    return out
