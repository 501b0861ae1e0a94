"""A pipeline's bubble: each stage's (rank's) time waiting for its neighbours, measured, against
the schedule's theory, and what more micro-batches, balanced stages or an interleaved schedule
would make of the step.

Measured, per rank, over its analysed steps (the ledger): its step, its own compute, and the
communication the ledger counts to it (the time its thread blocked in sends and receives: the
collectives' exposed time). The profiler window's pipeline sends and receives (role
``pipeline``) split that time in two: the transfer itself and the wait for the neighbour. A
send or receive whose peer was already there takes only its transfer; the quickest tenth of the
calls of each size (over every rank) is that floor, and whatever a call's exposed time holds
beyond it is waiting. The bubble of a stage is its wait's share of its step.

Theory, for p ranks in the pipeline, m micro-batches and v stages a rank: (p-1)/(v*m+p-1) of the
step, GPipe's and 1F1B's with v = 1 (1F1B changes the memory, not the bubble), interleaved
schedules' with v > 1; zero-bubble schedules have none in theory (no figure is given).

The model behind the estimates: with per-step compute c_s on stage s, a fill-drain schedule's
step is (sum(c) + (n-1) max(c)) / n for n = v*m chunks; the stage that computes most paces the
pipeline and waits (sum(c) - max(c)) / n a step. What the measured step holds beyond the model
and beyond the pacing stage's time outside the pipeline is each chunk's own cost on every stage
(its sends and receives, the schedule's Python): a cost d a chunk and stage lies on the
pipeline's critical path as a chunk's compute does, n + p - 1 times a step (the fill-drain step
with c_s + n d in place of c_s), so it is taken to grow as n + p - 1. Balanced stages take
(n-1)/n of (max(c) - mean(c)) off the step.

The compute a step is taken as it was measured, at this run's micro-batches: more, smaller
micro-batches compute no faster a row, and often slower (each of a layer's matrix products
reads its weights, writes and accumulates their gradient once a call whatever its rows, and
small products use the machine less well), which one run at one micro-batch size does not show.
So the step with more micro-batches is a bound, the least it can be: measured on a 2-core CPU,
a stage's compute a step grew 15-20% from 128 rows a micro-batch to 64 and ate the bubble's
saving; with device-like compute (the thread off the CPU, its time in proportion to the rows:
sample_jobs/pipeline_stages.py --stage-compute sleep) the bound fell within the spread of the
speedup measured.
Interleaving keeps each micro-batch's rows (its chunks are fewer layers), so it is estimated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from doctor.analyse.comms import RankComms
from doctor.analyse.parallelism import PIPELINE, Parallelism, schedule_name

#: The share of the calls of one size (quickest first) taken as the transfer alone.
FLOOR_QUANTILE = 0.1
#: Zero-bubble schedules (their class names hold one of these): no bubble in theory.
ZERO_BUBBLE = ("ZeroBubble", "DualPipe", "ZBV")


@dataclass(frozen=True)
class StageTime:
    """One rank's stage(s), per analysed step."""

    rank: int
    stage: str  # the stage indices it holds ("1", "0,2"; "" where not known)
    step_s: float
    compute_s: float
    wait_s: float  # waiting for its neighbours (the bubble)
    transfer_s: float  # its sends' and receives' own time, on its thread
    runnable_s: float = 0.0  # its thread waiting for a core (nan: not measured)

    @property
    def bubble(self) -> float:
        return self.wait_s / self.step_s if self.step_s > 0 else 0.0

    @property
    def idle(self) -> float:
        """Its step not covered by its compute in the pipeline's sends and receives."""
        return (self.wait_s + self.transfer_s) / self.step_s if self.step_s > 0 else 0.0


@dataclass(frozen=True)
class Bubble:
    schedule: str  # the schedule's class, "" where only the collectives were seen
    ranks: int  # p: ranks in the pipeline
    microbatches: int  # m
    virtual: int  # v: stages a rank
    stages: tuple[StageTime, ...]

    @property
    def name(self) -> str:
        return schedule_name(self.schedule) if self.schedule else "GPipe-style"

    @property
    def theory(self) -> float | None:
        """The schedule's bubble in theory (None: a zero-bubble schedule, or m not known)."""
        if any(z in self.schedule for z in ZERO_BUBBLE) or self.microbatches <= 0:
            return None
        return bubble_theory(self.ranks, self.microbatches * self.virtual)

    @property
    def measured(self) -> float:
        """The stages' mean bubble (their wait's share of their step)."""
        return float(np.mean([s.bubble for s in self.stages])) if self.stages else 0.0

    @property
    def pacing(self) -> StageTime:
        """The stage that computes most: it sets the pipeline's pace."""
        return max(self.stages, key=lambda s: (s.compute_s, -s.rank))

    @property
    def imbalance(self) -> float:
        """The pacing stage's compute over the stages' mean (1: balanced)."""
        mean = float(np.mean([s.compute_s for s in self.stages]))
        return self.pacing.compute_s / mean if mean > 0 else 1.0

    def step_s(self) -> float:
        return float(np.median([s.step_s for s in self.stages]))

    @property
    def core_wait(self) -> float:
        """The stages' mean share of their step waiting for a core (0: not measured): where
        they share too few cores, they cannot run side by side, which a pipeline needs."""
        shares = [s.runnable_s / s.step_s for s in self.stages
                  if s.step_s > 0 and s.runnable_s == s.runnable_s]
        return float(np.mean(shares)) if shares else 0.0

    def fill_drain_s(self, chunks: float, computes: list[float] | None = None) -> float:
        """The model's step over ``chunks`` micro-batches (times the stages a rank) for each
        stage's compute a step: (sum(c) + (n-1) max(c)) / n."""
        c = computes if computes is not None else [s.compute_s for s in self.stages]
        n = max(chunks, 1.0)
        return (sum(c) + (n - 1) * max(c)) / n

    def overhead_s(self, chunks: float | None = None) -> float:
        """The pacing stage's step beyond what the model and the step's time outside the
        pipeline explain: each chunk's own cost (its sends and receives, the schedule's
        Python), on the critical path n + p - 1 times a step; at ``chunks`` chunks where given
        (see the module docstring)."""
        s = self.pacing
        outside = max(s.step_s - s.compute_s - s.wait_s - s.transfer_s, 0.0)
        now = max(self.step_s() - outside - self.fill_drain_s(self._chunks()), 0.0)
        if chunks is None:
            return now
        return now * self._slots(chunks) / self._slots(self._chunks())

    def _chunks(self) -> float:
        return float(max(self.microbatches, 1) * self.virtual)

    def _slots(self, chunks: float) -> float:
        """The chunks' turns on the critical path of a fill-drain step: n + p - 1."""
        return max(chunks, 1.0) + max(self.ranks, 1) - 1

    def more_microbatches(self, times: int) -> float:
        """The step with ``times`` as many chunks: the model's, with the time outside the
        pipeline as measured, each chunk's own cost as it was and each stage's compute a step
        as measured; with more micro-batches that is a bound, the least the step can be (see
        the module docstring)."""
        chunks = self._chunks() * times
        outside = self.step_s() - self.fill_drain_s(self._chunks()) - self.overhead_s()
        return max(outside, 0.0) + self.fill_drain_s(chunks) + self.overhead_s(chunks)

    def interleaved(self, virtual: int) -> float:
        """The step with ``virtual`` times the stages a rank (interleaved): as many chunks a
        micro-batch, each 1/virtual of the stage."""
        return self.more_microbatches(virtual)

    def balanced(self) -> float:
        """The step with each stage's compute the stages' mean."""
        mean = float(np.mean([s.compute_s for s in self.stages]))
        n = self._chunks()
        return self.step_s() - self.fill_drain_s(n) + self.fill_drain_s(
            n, [mean] * len(self.stages))


def bubble_theory(ranks: int, microbatches: float) -> float:
    """A fill-drain schedule's bubble: (p-1)/(m+p-1) of the step for p ranks and m micro-batches
    (times the stages a rank, interleaved)."""
    return (ranks - 1) / (microbatches + ranks - 1) if ranks > 1 and microbatches > 0 else 0.0


def transfer_floor(calls: pd.DataFrame) -> pd.Series:
    """Per call (index of ``calls``: the pipeline's sends and receives of every rank), the
    transfer alone: the quickest tenth of the calls of its size."""
    sizes = calls["bytes"].fillna(-1.0)
    return calls.groupby(sizes)["seconds"].transform(lambda s: s.quantile(FLOOR_QUANTILE))


def pipeline_bubble(ledger: pd.DataFrame | None, comms: Mapping[int, RankComms] | None,
                    par: Parallelism | None, schedules: pd.DataFrame | None = None
                    ) -> Bubble | None:
    """The pipeline's bubble (see the module docstring); None where no rank sent or received
    in a pipeline, or there is no ledger."""
    if ledger is None or ledger.empty or not comms:
        return None
    parts = {r: c for r, c in comms.items()
             if c.steps and "role" in c.calls and (c.calls["role"] == PIPELINE).any()}
    if not parts:
        return None
    every = pd.concat([c.calls[c.calls["role"] == PIPELINE] for c in parts.values()],
                      ignore_index=True)
    floor = transfer_floor(every)
    every = every.assign(transfer=np.minimum(every["exposed_s"], floor))
    stages = []
    for rank, c in sorted(parts.items()):
        mine_ledger = ledger[ledger["rank"] == rank] if "rank" in ledger else ledger
        if mine_ledger.empty:
            continue
        mine = every[every["rank"] == rank]
        total_exposed = float(c.calls["exposed_s"].sum())
        pipe_exposed = float(mine["exposed_s"].sum())
        step = float(mine_ledger["wall_s"].median())
        blocked = float(mine_ledger["communication"].median()) * (
            pipe_exposed / total_exposed if total_exposed > 0 else 0.0)
        transfer = blocked * (float(mine["transfer"].sum()) / pipe_exposed
                              if pipe_exposed > 0 else 0.0)
        runnable = float(mine_ledger["runnable_s"].median()) if "runnable_s" in mine_ledger \
            else float("nan")
        stages.append(StageTime(rank, _stage_of(schedules, rank), step,
                                float(mine_ledger["compute"].median()), blocked - transfer,
                                transfer, runnable))
    if not stages:
        return None
    schedule = par.schedule if par is not None else ""
    p = len(stages)
    virtual = par.stages // p if par is not None and par.stages > p and \
        par.stages % p == 0 else 1
    m = par.microbatches if par is not None and par.microbatches else \
        _microbatches_from_calls(parts)
    return Bubble(schedule, p, m, virtual, tuple(stages))


def window_as_ledger(window: pd.DataFrame | None) -> pd.DataFrame | None:
    """The profiler window's steps in the ledger's columns (wall, compute, communication),
    for a bubble where there is no ledger (a trace analysed on its own)."""
    if window is None or window.empty or "dur_s" not in window:
        return None
    return pd.DataFrame({
        "rank": window.get("rank", 0), "wall_s": window["dur_s"],
        "compute": window.get("excl_compute_s", 0.0),
        "communication": window.get("comm_exposed_s", 0.0)})


def _stage_of(schedules: pd.DataFrame | None, rank: int) -> str:
    if schedules is None or schedules.empty:
        return ""
    mine = schedules[schedules["rank"] == rank]
    return str(mine["stage_indices"].iloc[0]) if len(mine) else ""


def _microbatches_from_calls(parts: Mapping[int, RankComms]) -> int:
    """m from the sends and receives, where the schedule is not known: an end stage sends and
    receives once each a micro-batch (the fewest calls of any rank: half of them)."""
    fewest = min(float((c.calls["role"] == PIPELINE).sum()) / c.steps for c in parts.values())
    return max(round(fewest / 2), 1)
