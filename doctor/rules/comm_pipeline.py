"""The fixes for a pipeline's exposed sends and receives (doctor.analyse.bubble): more
micro-batches, a 1F1B or interleaved schedule, balanced stages; never DDP's bucket, no_sync or
compression, which are for gradient all-reduces alone (doctor.rules.communication).

Each estimate is the pipeline model's step after the change against the step measured
(doctor.analyse.bubble.Bubble). More micro-batches get a bound, not an estimate: the model takes
each stage's compute a step as measured, and smaller micro-batches compute no faster a row,
often slower, which one run at one micro-batch size does not show; the bound is the speedup the
bubble's shrinking would give at most, and the micro-batches are the one setting ``doctor try``
applies (the schedule's ``n_microbatches``), so that a try measures what the bound cannot; the
schedule's class and the split into stages are the job's code."""

from __future__ import annotations

from typing import Any

from doctor.analyse.bubble import Bubble, bubble_theory
from doctor.verdict import Fix

#: The micro-batches the bound is for, as a multiple of the job's: one doubling (the model
#: leaves out that smaller micro-batches compute less efficiently, which grows with the factor).
TIMES = 2
#: Stages computing this much more than their mean are worth balancing.
IMBALANCE = 1.1
#: An estimate under this is not given.
MIN_SPEEDUP = 1.02
#: Stages waiting this share of their step for a core do not run side by side: the overlap
#: that more micro-batches or interleaving buy is not there to buy.
CORE_WAIT = 0.1


def _speedup(now: float, then: float) -> float | None:
    value = now / then if then > 0 else 0.0
    return value if value >= MIN_SPEEDUP else None


def _shares(b: Bubble) -> str:
    return ", ".join(f"rank {s.rank} {s.bubble:.0%}" for s in b.stages)


def bubble_evidence(b: Bubble) -> dict[str, Any]:
    """The bubble in the finding's evidence: schedule, p, m, theory, measured (mean and by
    rank), the transfers apart, the pacing stage and its imbalance."""
    return {"schedule": b.name, "ranks": b.ranks, "microbatches": b.microbatches,
            "stages_per_rank": b.virtual, "theory": b.theory, "measured": b.measured,
            "by_rank": {str(s.rank): s.bubble for s in b.stages},
            "transfer_s_per_step": {str(s.rank): s.transfer_s for s in b.stages},
            "compute_s_per_step": {str(s.rank): s.compute_s for s in b.stages},
            "pacing_rank": b.pacing.rank, "imbalance": b.imbalance,
            "waiting_for_a_core": b.core_wait,
            "more_microbatches_at_most": more_microbatches_bound(b)}


def more_microbatches_bound(b: Bubble) -> float | None:
    """The most ``TIMES`` as many micro-batches can speed the step up, by the model (the
    stages' compute a step as measured); None where the schedule's bubble is not known."""
    if b.theory is None or b.microbatches <= 0:
        return None
    then = b.more_microbatches(TIMES)
    return b.step_s() / then if then > 0 else None


def pipeline_fixes(b: Bubble) -> list[Fix]:
    """The fixes that fit the pipeline, best estimate first: more micro-batches, 1F1B and
    interleaving only where the model finds the step shorter with more of them (or cannot
    tell: stages that wait for a core), balancing where the stages' compute differs."""
    step = b.step_s()
    m, p = b.microbatches, b.ranks
    pace = b.pacing
    cls = b.schedule or "ScheduleGPipe"
    fixes: list[Fix] = []
    theory = b.theory
    said = (f"the stages wait for their neighbours {b.measured:.0%} of the step on average "
            f"({_shares(b)}; the sends' and receives' own time apart: "
            f"{pace.transfer_s * 1e3:.1f} ms a step on rank {pace.rank})")
    if theory is not None:
        said += (f"; in theory, {b.name} with {p} stages and {m} micro-batches idles "
                 f"{theory:.0%}: (p-1)/(m+p-1)")
    crowded = b.core_wait >= CORE_WAIT
    if crowded:
        said += (f"; but the stages waited for a core {b.core_wait:.0%} of their step (the "
                 "ranks and other processes share too few cores): a pipeline's stages overlap "
                 "only where each has a core of its own, so no estimate is given for more "
                 "overlap here")
    bound = more_microbatches_bound(b)
    gain = None if crowded or bound is None else _speedup(bound, 1.0)
    # more overlap where the model finds it (or cannot tell: stages short of cores); a change
    # the model predicts no gain for even at best is left out, as the communication model's are
    overlap = m > 0 and theory is not None and (crowded or gain is not None)
    if overlap:
        m2 = m * TIMES
        why = said + f"; at {m2} it would be {bubble_theory(p, m2 * b.virtual):.0%}"
        if gain is not None:
            why += (f". The step would be at most {gain:.2f}x faster: the model fitted to the "
                    f"run gives {b.more_microbatches(TIMES) * 1e3:.0f} ms a step at {m2} "
                    f"against {step * 1e3:.0f} ms now, the stages' fill and drain shrinking "
                    f"while each micro-batch's own cost ({b.overhead_s() * 1e3:.1f} ms a step "
                    "now beyond the model: sends and receives, the schedule's Python) grows "
                    "with their count. A bound, not an estimate: it takes each stage's compute "
                    f"a step as measured at {m} micro-batches, and smaller ones compute no "
                    "faster a row, often slower (each matrix product reads its weights, and "
                    "writes and accumulates their gradients, once a micro-batch; small products "
                    "use the machine less well), which one run does not show: time the step at "
                    f"{m2} (doctor try does)")
        fixes.append(Fix(
            title=f"Split each batch into more micro-batches ({m} -> {m2})",
            why=why + f"; the batch must split into {m2}",
            code=f"schedule = {cls}(stage, n_microbatches={m2}, loss_fn=loss_fn)",
            apply={"pipeline": {"n_microbatches": m2}}))
    if overlap and "1F1B" not in cls and b.virtual == 1 and "ZeroBubble" not in cls:
        fixes.append(Fix(
            title="Use Schedule1F1B to fit more micro-batches",
            why=(f"1F1B has the same bubble as {b.name}, but each stage holds at most {p} "
                 f"micro-batches' activations at once instead of all {m}: more micro-batches "
                 "fit in the same memory"),
            code="from torch.distributed.pipelining import Schedule1F1B\n"
                 f"schedule = Schedule1F1B(stage, n_microbatches={max(2 * m, p)}, "
                 "loss_fn=loss_fn)"))
    if overlap and b.virtual == 1:
        fixes.append(Fix(
            title="Interleave two stages a rank (ScheduleInterleaved1F1B)",
            why=(f"with each rank holding 2 smaller stages the bubble is "
                 f"{bubble_theory(p, 2 * m):.0%} instead of {theory:.0%}: (p-1)/(v*m+p-1), for "
                 f"twice the sends and receives; n_microbatches must be a multiple of {p}"),
            code="from torch.distributed.pipelining import ScheduleInterleaved1F1B\n"
                 "stages = [PipelineStage(part, i, 2 * world, device)  # 2 parts a rank\n"
                 "          for i, part in ((rank, first), (rank + world, second))]\n"
                 f"schedule = ScheduleInterleaved1F1B(stages, n_microbatches={max(m, p)}, "
                 "loss_fn=loss_fn)",
            estimated_speedup=None if crowded else _speedup(step, b.interleaved(2))))
    if len(b.stages) > 1 and b.imbalance >= IMBALANCE:
        fast = min(b.stages, key=lambda s: s.compute_s)
        where = f" (stage {pace.stage})" if pace.stage else ""
        fixes.append(Fix(
            title=f"Balance the stages: rank {pace.rank}'s stage is the slowest "
                  f"({b.imbalance:.1f}x the stages' mean compute)",
            why=(f"rank {pace.rank}{where} computes {pace.compute_s * 1e3:.1f} ms a step, "
                 f"rank {fast.rank} {fast.compute_s * 1e3:.1f} ms: the others wait for it at "
                 f"every micro-batch (rank {fast.rank} waits {fast.bubble:.0%} of its step); "
                 "moving layers off it until each stage computes the same takes (m-1)/m of "
                 "its excess off the step"),
            code="# split the model where each stage's forward and backward take the same\n"
                 "# time: move layers from the slowest stage to its neighbours",
            estimated_speedup=None if crowded else _speedup(step, b.balanced())))
    return sorted(fixes, key=lambda f: -(f.estimated_speedup or 0.0))
