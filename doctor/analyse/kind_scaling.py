"""The step at more ranks for the same global batch, for each kind of parallelism: DDP's (its
all-reduce model, doctor.analyse.comm_model.scaling), a sharded job's, a pipeline's and a tensor
parallel job's (the sharded model with its own collectives and DTensor's host work kept whole:
doctor.analyse.tensor_parallel).

Sharded data parallel (FSDP, FSDP2, ZeRO-3), from N = n ranks measured to N' ranks:

- the work outside the exposed communication divides by N'/N (each rank holds a smaller part
  of the same global batch);
- each unit's all-gather and reduce-scatter move the unit's whole parameters (gradients) at
  any N' (their message, as nccl-tests size it: the gathered output, the scattered input), of
  which each rank's link carries (N'-1)/N'; a call costs ``alpha`` per ring hop (N'-1 of them);
  ``alpha`` and ``beta`` are fitted to the rank's own sharded collectives and anchored to
  their measured time (doctor.analyse.comm_model.fit_link); past ``ranks_per_node`` ranks the
  link between nodes sets ``beta``;
- of that communication, the share no compute hid stays as measured (its exposed fraction),
  and the time compute hid cannot exceed the time it hid here times N/N' (the compute that
  hid it shrinks): exposed' = max(f T', T' - H N/N').

A pipeline of p stages (one a rank) with m micro-batches, to p' stages with the same m:

- each stage's compute divides by p'/p (the same model over more stages), the slowest stage's
  lead over the mean kept; the time outside the schedule (the optimizer's step of the stage's
  own parameters) divides alike;
- the fill-drain model of doctor.analyse.bubble gives the step, (sum(c) + (n-1) max(c)) / n
  over n micro-batches (times the stages a rank): its bubble grows as (p'-1)/(n+p'-1);
- each boundary still sends the same activations a micro-batch: the measured per-micro-batch
  cost (sends and receives, the schedule's own) stays, and past one node the transfers take
  the measured bandwidth over the link between nodes' longer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from doctor.analyse.bubble import Bubble, bubble_theory
from doctor.analyse.comm_model import SCALES, LinkFit, ScalePoint, fit_link
from doctor.analyse.comms import CommModel, RankComms, critical
from doctor.analyse.ops import RankOps
from doctor.analyse.parallelism import PIPELINE, SHARDED, TENSOR, Parallelism
from doctor.analyse.tensor_parallel import dtensor_host_s
from doctor.trace.collectives import COLLECTIVES, bus_factor

DDP, SHARDED_KIND, PIPELINE_KIND, TENSOR_KIND = "ddp", "sharded", "pipeline", "tensor"


@dataclass(frozen=True)
class KindScaling:
    """The step at more ranks for the same global batch, the model of the job's own kind."""

    kind: str  # "ddp", "sharded", "pipeline", "tensor"
    points: tuple[ScalePoint, ...]  # the measured world first
    note: str  # what the model keeps and changes, in words

    def far_point(self, times: int = 4) -> ScalePoint | None:
        """The first point at ``times`` the measured ranks or more (None: none)."""
        base = self.points[0].ranks if self.points else 0
        return next((p for p in self.points if p.ranks >= times * base), None)


@dataclass(frozen=True)
class ShardedComm:
    """One rank's sharded collectives per step, measured, and the link fitted to them."""

    world: int
    step_s: float
    comm_s: float
    exposed_s: float
    calls: pd.DataFrame  # kind, bytes: one step's collectives (all of the window's, weighted)
    per_step: float  # 1 / the window's steps: each call's weight in a step
    link: LinkFit
    fixed_s: float = 0.0  # a step's work that more ranks do not divide (DTensor's host work)

    def modelled(self, world: int, beta: float | None = None, hops: float = 1.0) -> float:
        """A step's sharded collectives over ``world`` ranks by the alpha-beta model."""
        b = beta or self.link.beta_bytes_s
        share = np.asarray([bus_factor(COLLECTIVES.index(k), world)
                            for k in self.calls["kind"].astype(str)], float)
        each = self.link.alpha_s * hops + share * self.calls["bytes"].to_numpy(float) / b
        return float(each.sum()) * self.per_step


def sharded_comm(c: RankComms, world: int, role: str = SHARDED, fixed_s: float = 0.0
                 ) -> ShardedComm | None:
    """The model of one rank's collectives of ``role`` (a sharded job's; a tensor parallel
    job's, with ``fixed_s`` of its step that more ranks do not divide); None: none of known
    size, or no steps."""
    calls = c.calls
    if calls.empty or "role" not in calls or c.steps <= 0 or c.window_s <= 0 or world < 2:
        return None
    mine = calls["role"] == role
    link = fit_link(calls, world, of=mine)
    sized = calls[mine & calls["bytes"].notna()]
    if link is None or sized.empty:
        return None
    return ShardedComm(world, c.window_s / c.steps,
                       float(calls.loc[mine, "seconds"].sum()) / c.steps,
                       float(calls.loc[mine, "exposed_s"].sum()) / c.steps,
                       sized[["kind", "bytes"]].reset_index(drop=True), 1.0 / c.steps, link,
                       fixed_s)


def sharded_scaling(m: ShardedComm, ranks: tuple[int, ...] = SCALES, *,
                    link: LinkFit | None = None, ranks_per_node: int | None = None
                    ) -> list[ScalePoint]:
    """The step at N' ranks for the same global batch (see the module docstring)."""
    out = [ScalePoint(m.world, m.step_s, m.exposed_s, False)]
    measured = m.modelled(m.world)
    if m.comm_s <= 0 or measured <= 0:
        return out
    scale = m.comm_s / measured
    exposed_part = min(m.exposed_s / m.comm_s, 1.0)
    hidden = max(m.comm_s - m.exposed_s, 0.0)
    for n in (r for r in ranks if r > m.world):
        ratio = m.world / n
        across = link is not None and ranks_per_node is not None and n > ranks_per_node
        beta = link.beta_bytes_s if across and link is not None else None
        comm = scale * m.modelled(n, beta, hops=(n - 1) / max(m.world - 1, 1))
        exposed = max(exposed_part * comm, comm - hidden * ratio)
        divided = max(m.step_s - m.exposed_s - m.fixed_s, 0.0) * ratio
        out.append(ScalePoint(n, divided + min(m.fixed_s, m.step_s - m.exposed_s) + exposed,
                              exposed, across))
    return out


def pipeline_scaling(b: Bubble, ranks: tuple[int, ...] = SCALES, *,
                     slower_link: float = 1.0, ranks_per_node: int | None = None
                     ) -> list[ScalePoint]:
    """The step at p' stages, one a rank, with the same micro-batches (see the module
    docstring). ``slower_link``: how many times longer a transfer takes between nodes than it
    took here (1: the same, or not known), used past ``ranks_per_node``."""
    computes = [s.compute_s for s in b.stages]
    if not computes or b.step_s() <= 0:
        return []
    p, chunks = b.ranks, float(max(b.microbatches, 1) * b.virtual)
    overhead = b.overhead_s()
    outside = max(b.step_s() - b.fill_drain_s(chunks) - overhead, 0.0)
    total, slowest = sum(computes), max(computes)
    transfer = b.pacing.transfer_s

    def point(n: int, across: bool) -> ScalePoint:
        ratio = p / n
        step = outside * ratio + (total + (chunks - 1) * slowest * ratio) / chunks + overhead
        if across:
            step += transfer * (slower_link - 1.0)
        return ScalePoint(n, step, max(step - outside * ratio - total / n, 0.0), across)

    out = [point(p, False)]
    for n in (r for r in ranks if r > p):
        out.append(point(n, slower_link > 1.0 and ranks_per_node is not None
                         and n > ranks_per_node))
    return out


def pipeline_note(b: Bubble, points: list[ScalePoint]) -> str:
    chunks = max(b.microbatches, 1) * b.virtual
    far = points[-1].ranks if points else b.ranks
    return (f"more stages at the same {b.microbatches or '?'} micro-batches: each stage's "
            f"compute divides by p'/{b.ranks}, the bubble grows from "
            f"{bubble_theory(b.ranks, chunks):.0%} to {bubble_theory(far, chunks):.0%} at {far} "
            "stages ((p-1)/(m+p-1)), and each boundary still sends the same activations a "
            "micro-batch")


SHARDED_NOTE = ("the same global batch over more ranks: compute divides by N'/N; each unit's "
                "all-gather and reduce-scatter still move its whole parameters, (N'-1)/N' of "
                "them over each rank's link; the exposed share of that communication kept as "
                "measured")
TENSOR_NOTE = ("the same global batch over more tensor-parallel ranks: each layer's shard, and "
               "the compute outside DTensor's host work, divides by g'/g; DTensor's host work "
               "stays; each all-reduce still moves the same activations, 2(g'-1)/g' of them "
               "over each rank's link; the exposed share of that communication kept as "
               "measured")
DDP_NOTE = ("the same global batch over more ranks: compute divides by N'/N; the gradient "
            "all-reduce's bus share grows to 2(N'-1)/N'")


def job_scaling(par: Parallelism | None, comms: Mapping[int, RankComms] | None,
                models: Mapping[int, CommModel] | None, bubble: Bubble | None,
                link: LinkFit | None, ranks_per_node: int | None,
                ops: Mapping[int, RankOps] | None = None) -> KindScaling | None:
    """The scaling of the job's own kind: a sharded job's (its critical rank: the most exposed
    sharded communication), a pipeline's, a tensor parallel job's (its ranks' op tables ``ops``
    give DTensor's host work), else DDP's (its all-reduce model); DDP's is never given for a
    job whose collectives are not gradient all-reduces."""
    kinds = par.kinds if par is not None else ()
    if TENSOR_KIND in kinds and SHARDED_KIND not in kinds and comms:
        size = par.tensor_size if par is not None and par.tensor_size else 0
        world = size or (par.world if par is not None and par.world else len(comms))
        fitted = [m for r, c in comms.items() if (m := sharded_comm(
            c, world, TENSOR, dtensor_host_s(ops[r].table, c.steps) if ops and r in ops
            else 0.0)) is not None]
        if fitted:
            worst = max(fitted, key=lambda m: m.exposed_s)
            points = sharded_scaling(worst, link=link, ranks_per_node=ranks_per_node)
            return KindScaling(TENSOR_KIND, tuple(points), TENSOR_NOTE)
        return None
    if SHARDED_KIND in kinds and comms:
        world = par.world if par is not None and par.world else len(comms)
        fitted = [m for c in comms.values() if (m := sharded_comm(c, world)) is not None]
        if fitted:
            worst = max(fitted, key=lambda m: m.exposed_s)
            points = sharded_scaling(worst, link=link, ranks_per_node=ranks_per_node)
            return KindScaling(SHARDED_KIND, tuple(points), SHARDED_NOTE)
        return None
    if PIPELINE_KIND in kinds:
        if bubble is None:
            return None
        points = pipeline_scaling(bubble, slower_link=_slower(comms, link),
                                  ranks_per_node=ranks_per_node)
        return KindScaling(PIPELINE_KIND, tuple(points), pipeline_note(bubble, points)) \
            if points else None
    return ddp_scaling(models)


def ddp_scaling(models: Mapping[int, CommModel] | None) -> KindScaling | None:
    """DDP's scaling: its critical rank's all-reduce model (doctor.analyse.comm_model)."""
    model = critical(models or {})
    if model is None or not model.scaling:
        return None
    return KindScaling(DDP, model.scaling, DDP_NOTE)


def _slower(comms: Mapping[int, RankComms] | None, link: LinkFit | None) -> float:
    """How many times longer the pipeline's transfers take over ``link`` than the bandwidth
    they were measured at (their median bus bandwidth; 1: either not known)."""
    if link is None or not comms or link.beta_bytes_s <= 0:
        return 1.0
    parts = [c.calls.loc[c.calls["role"] == PIPELINE, "bus_bytes_s"] for c in comms.values()
             if "role" in c.calls and "bus_bytes_s" in c.calls]
    rates = pd.concat(parts, ignore_index=True).dropna() if parts else pd.Series(dtype=float)
    if rates.empty:
        return 1.0
    return max(float(rates.median()) / link.beta_bytes_s, 1.0)
