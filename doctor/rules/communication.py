"""Communication rules over the profiler window: collectives not hidden behind compute.

The time ranks spend in collectives waiting for a straggler (doctor.rules.distributed) is the
straggler's: it is taken out of the exposed communication, so that one cause is not reported
twice."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from doctor.analyse.bubble import Bubble, pipeline_bubble, window_as_ledger
from doctor.analyse.comm_model import WhatIf
from doctor.analyse.comms import critical
from doctor.analyse.evidence import Evidence
from doctor.analyse.kind_scaling import DDP, PIPELINE_KIND
from doctor.analyse.parallelism import GRADIENTS, OTHER, PIPELINE, SHARDED, STATS, TENSOR, ZERO
from doctor.analyse.shard_phases import critical_phases
from doctor.analyse.tensor_parallel import dtensor_host_s
from doctor.rules.base import rule
from doctor.rules.comm_kinds import (
    ROLE_SHARE,
    WORDS,
    Exposed,
    all_to_all_fixes,
    exposed_by_role,
    stats_fixes,
    zero_fixes,
)
from doctor.rules.comm_pipeline import bubble_evidence, pipeline_fixes
from doctor.rules.deepspeed_fixes import deepspeed_fixes
from doctor.rules.shard_fixes import sharded_fixes
from doctor.rules.tensor_fixes import tensor_fixes
from doctor.rules.window import means, speedup, window_finding, window_steps
from doctor.verdict import Finding, Fix


def no_sync_code(every: str = "accumulation_steps") -> str:
    """A loop that all-reduces once every ``every`` micro-batches."""
    return (
        "import contextlib\n"
        "for i, (inputs, targets) in enumerate(loader):\n"
        f"    last = (i + 1) % {every} == 0\n"
        "    ctx = contextlib.nullcontext() if last else model.no_sync()\n"
        "    with ctx:\n"
        "        loss_fn(model(inputs), targets).backward()\n"
        "    if last:\n"
        "        optimizer.step()\n"
        "        optimizer.zero_grad()"
    )


NO_SYNC = Fix(
    title="Accumulate gradients locally with no_sync()",
    why="with gradient accumulation, only the last micro-batch needs an all-reduce",
    code=no_sync_code(),
)
COMPRESS = Fix(
    title="Compress gradients before the all-reduce",
    why="halving the bytes on the wire halves bandwidth-bound collectives",
    code=(
        "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n"
        "model.register_comm_hook(None, default_hooks.bf16_compress_hook)"
    ),
)


def bucket_fix(ddp_devices: str, best: WhatIf | None) -> Fix:
    """DDP's bucket cap: the one the model predicts best, 50 MB where there is no model."""
    cap = best.value if best is not None and best.value is not None else 50.0
    why = ("all-reduce starts when a bucket fills: smaller buckets start earlier in backward "
           "and overlap more of it, larger ones pay the per-call latency fewer times")
    if best is not None:
        why += f"; the model's best cap here is {cap:g} MB ({best.note})"
    return Fix(
        title=f"Set DDP's bucket_cap_mb={cap:g}",
        why=why,
        code=(
            "model = torch.nn.parallel.DistributedDataParallel(\n"
            f"    model,{ddp_devices}\n"
            f"    bucket_cap_mb={cap:g}, gradient_as_bucket_view=True, static_graph=True,\n"
            ")"
        ),
        # static_graph is left to the user: it breaks a model whose graph changes
        apply={"ddp": {"bucket_cap_mb": cap, "gradient_as_bucket_view": True}},
        estimated_speedup=best.speedup if best is not None else None,
    )


def model_fixes(ev: Evidence, ddp_devices: str, share: float) -> tuple[Fix, ...]:
    """The fixes, each with the speedup the communication model predicts for it, best first;
    a change the model predicts no gain for (under 2 %) is left out. The model says what share
    of the exposed communication a fix saves; ``share`` (communication's share of the step)
    turns that into a speedup. Without a model (no all-reduce of known size): the fixes without
    estimates."""
    model = critical(ev.comm_models or {})
    if model is None:
        return bucket_fix(ddp_devices, None), NO_SYNC, COMPRESS
    fixes: list[Fix] = []
    exposed = model.model.exposed_s

    def estimate(w: WhatIf | None) -> float | None:
        if w is None or exposed <= 0:
            return None
        value = speedup(1.0, share * (exposed - w.exposed_s) / exposed)
        return value if value >= 1.02 else None

    best = model.best("bucket_cap")
    if (value := estimate(best)) is not None:
        fixes.append(replace(bucket_fix(ddp_devices, best), estimated_speedup=value))
    for fix, name in ((NO_SYNC, "no_sync"), (COMPRESS, "compress")):
        w = model.best(name)
        if (value := estimate(w)) is not None and w is not None:
            why = fix.why + (f" ({w.note})" if w.note else "")
            code = no_sync_code(f"{w.value:g}") if name == "no_sync" and w.value is not None \
                else fix.code  # the job's own micro-batches a step
            fixes.append(replace(fix, why=why, code=code, estimated_speedup=value))
    # none the model can size (the critical rank's exposed time was all waiting): the fixes
    # as they are, without estimates
    return tuple(sorted(fixes, key=lambda f: -(f.estimated_speedup or 0.0))) or (
        bucket_fix(ddp_devices, None), NO_SYNC, COMPRESS)


def straggler_wait(ev: Evidence, frame_ranks: int) -> float:
    """Seconds a step the ranks spend, on average, waiting in collectives for a straggler (its
    finding's cause, not the communication's)."""
    search = ev.stragglers
    if search is None or not search.stragglers or frame_ranks <= 0:
        return 0.0
    return sum(sum(s.waiting.values()) for s in search.stragglers) / frame_ranks


@rule("comm.exposed", needs=("window",))
def exposed_communication(ev: Evidence) -> list[Finding]:
    f = window_steps(ev, device=None)
    step, comm, exposed_all = means(f, "dur_s", "comm_s", "comm_exposed_s")
    waited = min(straggler_wait(ev, int(f["rank"].nunique()) if "rank" in f else 1),
                 exposed_all)
    exposed = exposed_all - waited  # waiting for a straggler is the straggler's finding
    share = exposed / step
    if share < 0.05:
        return []
    world = ev.job.world_size
    overlapped = 1.0 - exposed / comm if comm > 0 else 0.0
    # the ledger's share (every analysed step, and the cores communication threads took)
    # sizes the estimate; the window's (profiled steps only) where there is no ledger
    ledger_share = ledger_comm_share(ev)
    removed = share if ledger_share is None else max(ledger_share - waited / step, 0.0)
    on_gpu = bool((f["device"] == "cuda").any()) if "device" in f else True
    ddp_devices = " device_ids=[local_rank]," if on_gpu else ""
    ex = exposed_by_role(ev.comms)
    job = ev.job
    spare = 1.0 if on_gpu or not job.cores else job.cores / max(job.ranks_here, 1) - 1.0
    # the pipeline's bubble over the analysed steps; over the window's where there is none
    bubble = ev.bubble
    if bubble is None and ex is not None and ex.share(PIPELINE) > 0:
        bubble = pipeline_bubble(ev.ledger, ev.comms, ev.parallelism) or \
            pipeline_bubble(window_as_ledger(f), ev.comms, ev.parallelism)
    fixes, roles = kind_fixes(ev, ex, ddp_devices, removed, min(max(spare, 0.0), 1.0), step,
                              bubble)
    par = ev.parallelism.describe() if ev.parallelism is not None else ""
    mostly = max(roles, key=lambda r: roles[r]) if roles else ""
    words = WORDS if ev.parallelism is None or ev.parallelism.deepspeed_config is None else \
        {**WORDS, SHARDED: "DeepSpeed ZeRO's parameter all-gathers and gradient reductions"}
    phases = critical_phases(ev.shard_phases) if roles.get(SHARDED, 0.0) > 0 else None
    return [window_finding(
        "comm.exposed", "communication", share=share, bands=(0.2, 0.05),
        title=(
            f"Collectives take {share:.0%} of the step with no compute beside them "
            f"({overlapped:.0%} of communication is overlapped)"
            + (f", {roles[mostly]:.0%} of it {words[mostly]}" if mostly else "")
        ),
        evidence=dict(comm_s_per_step=comm, comm_exposed_s_per_step=exposed,
                      waiting_for_straggler_s_per_step=waited,
                      comm_exposed_share=share, comm_overlapped_fraction=overlapped,
                      comm_share_of_steps=removed,
                      world_size=world if isinstance(world, int) else None,
                      **({"parallelism": par} if par else {}),
                      **({"exposed_by_role": roles} if roles else {}),
                      **({"pipeline_bubble": bubble_evidence(bubble)} if bubble else {}),
                      **({"sharded_phases": phases.to_dict(units=False)} if phases else {})),
        fixes=fixes, step_s=step, removed_s=removed * step,
    )]


def kind_fixes(ev: Evidence, ex: Exposed | None, ddp_devices: str, share: float,
               overlap_cores: float, step: float, bubble: Bubble | None = None
               ) -> tuple[list[Fix], dict[str, float]]:
    """The fixes that fit the kinds of collectives exposed (doctor.rules.comm_kinds), best
    estimate first, and each role's share of the exposed communication: DDP's fixes only for
    gradient all-reduces (all of them where no collective has a role: a trace of another
    door)."""
    if ex is None or ex.total_s <= 0:
        return list(model_fixes(ev, ddp_devices, share)), {}
    roles = {r: ex.share(r) for r in ex.by_role if ex.share(r) > 0}
    fixes: list[Fix] = []
    if ex.share(GRADIENTS) >= ROLE_SHARE:
        fixes += model_fixes(ev, ddp_devices, share * ex.share(GRADIENTS))
    deepspeed = ev.parallelism is not None and ev.parallelism.deepspeed_config is not None
    if ex.share(SHARDED) >= ROLE_SHARE and deepspeed and ev.parallelism is not None:
        every = pd.concat([c.calls for c in (ev.comms or {}).values()], ignore_index=True)
        fixes += deepspeed_fixes(ex, ev.parallelism, share, every)
    elif ex.share(SHARDED) >= ROLE_SHARE:
        fixes += sharded_fixes(ex, ev.parallelism, share, overlap_cores, step * (1 - share))
    if ex.share(STATS) >= ROLE_SHARE:
        fixes += stats_fixes(ex, share)
    if ex.share(PIPELINE) >= ROLE_SHARE and bubble is not None:
        fixes += pipeline_fixes(bubble)
    if ex.share(ZERO) >= ROLE_SHARE:
        fixes += zero_fixes(ex, share)
    if ex.share(TENSOR) >= ROLE_SHARE:
        links = [c.link for c in (ev.comms or {}).values() if c.link is not None]
        ranks = ex.of(TENSOR)["rank"] if "rank" in ex.calls else pd.Series(dtype=int)
        rank = int(ranks.iloc[0]) if len(ranks) else None
        ops = (ev.ops or {}).get(rank) if rank is not None else None
        memory = ev.memory_use.ranks.get(rank) if ev.memory_use is not None and \
            rank is not None else None
        fixes += tensor_fixes(ex, ev.parallelism, share, step, memory,
                              links[0].gb_per_s * 1e9 if links else None,
                              dtensor_host_s(ops.table, ex.steps) if ops is not None else 0.0)
    if ex.share(OTHER) >= ROLE_SHARE:
        fixes += all_to_all_fixes(ex)
    return sorted(fixes, key=lambda f: -(f.estimated_speedup or 0.0)), roles


def ledger_comm_share(ev: Evidence) -> float | None:
    """Communication's share of the analysed steps in the ledger (None: no ledger)."""
    led = ev.ledger
    if led is None or led.empty or "communication" not in led or "wall_s" not in led:
        return None
    wall = float(led["wall_s"].sum())
    return float(led["communication"].sum()) / wall if wall > 0 else None


#: The scaling finding names the step at this many times the job's ranks.
SCALE_FACTOR = 4
SCALE_SHARE = 0.3  # exposed communication at that scale that makes it worth saying


@rule("comm.scaling", needs=("scaling",))
def scaling_outlook(ev: Evidence) -> list[Finding]:
    """What the model of the job's own kind (DDP's all-reduce, a sharded job's gathers and
    scatters, a pipeline's stages: doctor.analyse.kind_scaling) predicts for more ranks on the
    same global batch: said (as information) where the exposed share would reach SCALE_SHARE.
    DDP's fixes go with DDP's model only."""
    model = critical(ev.comm_models or {})
    scale = ev.scaling
    if scale is None or len(scale.points) < 2:
        return []
    base = scale.points[0]
    target = base.ranks * SCALE_FACTOR
    point = next((p for p in scale.points if p.ranks >= target), scale.points[-1])
    if point.exposed_share < SCALE_SHARE:
        return []
    ddp = scale.kind == DDP and model is not None
    what = "exposed communication" if scale.kind != PIPELINE_KIND else \
        "each stage's time not computing (the bubble and its transfers)"
    unit = "stages" if scale.kind == PIPELINE_KIND else "ranks"
    return [Finding(
        id="comm.scaling", category="communication", severity="info",
        title=(f"At {point.ranks} {unit} with the same global batch, {point.exposed_share:.0%} "
               f"of the step would be {what} (scaling efficiency "
               f"{point.efficiency(base):.0%}; {base.exposed_share:.0%} at {base.ranks} now)"),
        evidence={"kind": scale.kind, "model": scale.note,
                  "ranks_now": base.ranks, "ranks": point.ranks,
                  "step_s_now": base.step_s, "step_s": point.step_s,
                  "exposed_share_now": base.exposed_share,
                  "exposed_share": point.exposed_share,
                  "scaling_efficiency": point.efficiency(base),
                  "across_nodes": point.across_nodes,
                  **({"bytes_per_step": model.model.bytes_per_step,
                      "bus_gb_per_s": model.model.link.beta_bytes_s / 1e9}
                     if ddp and model is not None else {})},
        fixes=(NO_SYNC, COMPRESS) if ddp else (),
    )]
