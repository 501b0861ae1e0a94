"""Memory rules over the breakdown (doctor.analyse.memory): a rank near its limit (or out of
memory), with what each fix frees, and a GPU with room for a larger batch while it waits.

Bytes freed, from the measured parts: autocast stores fp32 activations in 16 bits (half of
them); activation checkpointing of k segments keeps about 1/k of them (k = 4 here: three
quarters) for about one more forward per step; halving the micro-batch with two accumulation
steps halves them and keeps the global batch; ZeRO-1 shards optimizer state over N ranks
((N-1)/N of it freed), FSDP parameters, gradients and state alike; an 8-bit Adam keeps 2 bytes
of state per parameter instead of 8; a for-loop optimizer step (``foreach=False``) does without
the temporaries of the size of a parameter group; expandable segments give back the split
blocks, only when fragmentation was measured.
"""

from __future__ import annotations

from doctor.analyse.evidence import Evidence
from doctor.analyse.memory import RankMemory
from doctor.analyse.precision import Precision, gpu_precision
from doctor.rules.base import rule
from doctor.rules.gpu_counters import STARVED_INPUT, rank_ledger_shares
from doctor.units import human_bytes
from doctor.verdict import Finding, Fix

NEAR_LIMIT = 0.90  # of the capacity, at the peak
CRITICAL = 0.95
FRAGMENTED = 0.10  # split blocks as a share of reserved, for expandable segments to be offered
CHECKPOINT_SEGMENTS = 4
ROOMY = 0.50  # at most this share of the GPU used at the peak ...
UNDER_USED = 0.70  # ... while its kernels run less than this share of the time
KEEP_FREE = 0.10  # of the capacity, left when sizing a larger batch
ADAM = ("Adam", "AdamW")  # torch.optim's: two fp32 moments per parameter


def _dtype_bytes(m: RankMemory, kind: str, dtype: str) -> float:
    return sum(b for key, b in m.by_dtype.get(kind, {}).items() if key.endswith(f":{dtype}"))


def _fp32_activations(m: RankMemory) -> float:
    act = m.parts.get("activations", 0.0)
    if "activations" in m.by_dtype:
        return _dtype_bytes(m, "activations", "float32")
    params = m.parts.get("parameters", 0.0)
    fp32_model = params > 0 and _dtype_bytes(m, "parameters", "float32") >= 0.99 * params
    return act if fp32_model else 0.0  # activations' dtypes not measured: those of the model


def memory_fixes(m: RankMemory, world: int, precision: Precision | None = None,
                 autocast: str | None = None) -> list[Fix]:
    """Each fix that fits this rank, with the bytes it frees, the most first. ``precision``:
    the 16-bit type its device runs fast (doctor.analyse.precision; None, or one of another
    device: a GPU's of unknown generation, none on a CPU); ``autocast``: the 16-bit type the
    job autocasts to on that device already (then no autocast is offered)."""
    fixes: list[Fix] = []
    act = m.parts.get("activations", 0.0)
    state = m.parts.get("optimizer_state", 0.0)
    fp32 = _fp32_activations(m)
    device = "cuda" if m.device == "cuda" else "cpu"
    if precision is None or precision.device != device:
        precision = gpu_precision(None) if device == "cuda" else Precision(None, "not measured")
    if fp32 > 0 and precision.dtype is not None and autocast is None:
        fixes.append(Fix(
            title=f"Autocast the forward pass to {precision.dtype}",
            why=f"{human_bytes(fp32)} of the activations saved for backward are fp32; in 16 bits "
                f"they take half: about {human_bytes(fp32 / 2)} freed per step "
                f"({precision.why})",
            code=precision.autocast_code(),
            frees_bytes=fp32 / 2))
    if act > 0:
        k = CHECKPOINT_SEGMENTS
        fixes.append(Fix(
            title=f"Activation checkpointing in {k} segments",
            why=f"the {human_bytes(act)} of activations per step are recomputed in backward "
                f"instead of kept: about 1/{k} stays, {human_bytes(act * (k - 1) / k)} freed, "
                "for about one more forward pass per step",
            code="from torch.utils.checkpoint import checkpoint_sequential\n"
                 f"out = checkpoint_sequential(model, {k}, x, use_reentrant=False)  "
                 "# an nn.Sequential; else checkpoint() each block",
            frees_bytes=act * (k - 1) / k))
    if act > 0 and m.batch_size and m.batch_size >= 2:
        half = m.batch_size // 2
        fixes.append(Fix(
            title=f"batch_size {m.batch_size} -> {half}, with 2 gradient accumulation steps",
            why=f"activations scale with the micro-batch: about {human_bytes(act / 2)} freed, "
                f"and the global batch stays {m.batch_size}",
            code=f"loader = DataLoader(dataset, batch_size={half}, ...)\n"
                 "for i, (x, y) in enumerate(loader):\n"
                 "    (loss_fn(model(x), y) / 2).backward()\n"
                 "    if i % 2 == 1:\n        opt.step()\n        opt.zero_grad()",
            frees_bytes=act / 2))
    if world >= 2 and state > 0:
        share = (world - 1) / world
        static = m.static_bytes
        fixes.append(Fix(
            title=f"Shard the optimizer state over the {world} ranks (ZeRO-1)",
            why=f"each rank keeps 1/{world} of the {human_bytes(state)} of optimizer state: "
                f"{human_bytes(state * share)} freed per rank",
            code="from torch.distributed.optim import ZeroRedundancyOptimizer\n"
                 "opt = ZeroRedundancyOptimizer(model.parameters(), "
                 "optimizer_class=torch.optim.AdamW, lr=lr)",
            frees_bytes=state * share))
        fixes.append(Fix(
            title=f"FSDP over the {world} ranks (parameters, gradients and state sharded)",
            why=f"each rank keeps about 1/{world} of the {human_bytes(static)} of parameters, "
                f"gradients and optimizer state: {human_bytes(static * share)} freed per rank "
                "(one layer's parameters are gathered at a time)",
            code="from torch.distributed.fsdp import fully_shard\n"
                 "for block in model.children():\n    fully_shard(block)\nfully_shard(model)",
            frees_bytes=static * share))
    fp32_state = _dtype_bytes(m, "optimizer_state", "float32")
    adam = [o for o in m.optimizers if o in ADAM]
    if adam and fp32_state > 0:
        fixes.append(Fix(
            title=f"An 8-bit {adam[0]} (bitsandbytes)",
            why=f"its two moments take 2 bytes per parameter instead of 8: about "
                f"{human_bytes(fp32_state * 0.75)} of the {human_bytes(fp32_state)} of fp32 "
                "state freed",
            code=f"import bitsandbytes as bnb\nopt = bnb.optim.{adam[0]}8bit(model.parameters(), "
                 "lr=lr)",
            frees_bytes=fp32_state * 0.75))
    if m.device == "cuda" and adam and m.parts.get("parameters", 0.0) > 0:
        params = m.parts["parameters"]
        fixes.append(Fix(
            title=f"{adam[0]}(..., foreach=False)",
            why="the multi-tensor step allocates temporaries as large as a parameter group; a "
                f"step one tensor at a time needs up to {human_bytes(params)} less at the "
                "optimizer step (a little slower)",
            code=f"opt = torch.optim.{adam[0]}(model.parameters(), lr=lr, foreach=False)",
            frees_bytes=params))
    split = m.allocator.get("inactive_split_max_bytes", 0.0)
    reserved = m.allocator.get("reserved_peak_bytes", 0.0)
    if reserved > 0 and split >= FRAGMENTED * reserved:
        fixes.append(Fix(
            title="Expandable segments",
            why=f"the allocator holds {human_bytes(split)} in split blocks it cannot reuse "
                f"({split / reserved:.0%} of reserved): measured fragmentation",
            code="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python train.py",
            apply={"env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}},
            frees_bytes=split))
    return sorted(fixes, key=lambda f: -(f.frees_bytes or 0.0))


@rule("memory.near_limit", needs=("memory_use",))
def near_limit(ev: Evidence) -> list[Finding]:
    mem = ev.memory_use
    assert mem is not None  # guaranteed by needs
    tight = []
    for m in mem.ranks.values():
        used, cap = m.used_bytes, m.capacity_bytes
        ooms = m.allocator.get("num_ooms", 0.0)
        share = used / cap if used is not None and cap else None
        if ooms > 0 or (share is not None and share >= NEAR_LIMIT):
            tight.append((ooms, share or 0.0, m))
    if not tight:
        return []
    ooms, share, m = max(tight, key=lambda t: (t[0], t[1]))
    largest = m.largest_part
    where = "the machine" if m.device != "cuda" else f"rank {m.rank}'s GPU"
    title = (f"Out of memory on rank {m.rank} ({int(ooms)} CUDA OOM errors)" if ooms else
             f"Memory {share:.0%} full at the peak on {where}")
    used = m.used_bytes
    if used is not None and m.capacity_bytes:
        title += f": {human_bytes(used)} of {human_bytes(m.capacity_bytes)}"
    if largest:
        title += f"; the largest part is {largest.replace('_', ' ')} " \
                 f"({human_bytes(m.parts[largest])})"
    return [Finding(
        id="memory.near_limit", category="memory",
        severity="critical" if ooms or share >= CRITICAL else "warning", title=title,
        evidence={"rank": m.rank, "peak_bytes": used, "capacity_bytes": m.capacity_bytes,
                  "used_share": share, "num_ooms": int(ooms), "largest_part": largest,
                  **{f"{k}_bytes": v for k, v in m.parts.items()},
                  "ranks_near_limit": len(tight)},
        fixes=tuple(memory_fixes(m, mem.world_size, ev.job.precision,
                                 ev.job.autocasts_on("cuda" if m.device == "cuda" else "cpu"))),
    )]


@rule("memory.headroom", needs=("memory_use", "gpus", "ledger"))
def headroom(ev: Evidence) -> list[Finding]:
    mem, gpus = ev.memory_use, ev.gpus
    assert mem is not None and gpus is not None  # guaranteed by needs
    for m in mem.ranks.values():
        gpu = gpus.of_rank(m.rank)
        act, used, cap = m.parts.get("activations", 0.0), m.used_bytes, m.capacity_bytes
        if m.device != "cuda" or gpu is None or not m.batch_size or act <= 0 or not used or \
                not cap or used > ROOMY * cap or not gpu.util < UNDER_USED:
            continue
        if rank_ledger_shares(ev, m.rank)[1] >= STARVED_INPUT:
            continue  # the GPU waits for input (gpu.starved): a larger batch waits longer
        room = (1 - KEEP_FREE) * cap - (used - act)
        fits = int(m.batch_size * room / act)
        if fits < 2 * m.batch_size:
            continue
        return [Finding(
            id="memory.headroom", category="memory", severity="info",
            title=(f"Rank {m.rank} uses {used / cap:.0%} of its GPU's memory while the GPU is "
                   f"busy {gpu.util:.0%} of the time: batch_size {m.batch_size} -> up to "
                   f"~{fits} fits"),
            evidence={"rank": m.rank, "peak_bytes": used, "capacity_bytes": cap,
                      "activations_bytes": act, "batch_size": m.batch_size,
                      "fitting_batch_size": fits, "gpu_util": gpu.util},
            fixes=(Fix(
                title=f"batch_size {m.batch_size} -> {min(fits, 4 * m.batch_size)}",
                why=f"activations are {human_bytes(act)} per batch of {m.batch_size}; with "
                    f"{KEEP_FREE:.0%} of the GPU kept free, about {fits} samples fit. More "
                    "work per kernel launch fills an under-used GPU; scale the learning rate "
                    "with the batch",
                code=f"loader = DataLoader(dataset, batch_size={min(fits, 4 * m.batch_size)}, "
                     "...)"),),
        )]
    return []
