"""The fixes for exposed communication that fit the collectives' kind of parallelism
(doctor.analyse.parallelism): synchronised batch statistics
(plain BatchNorm where each rank's batch is large enough, GroupNorm, a larger batch a rank), a
sharded optimizer's parameter broadcasts (one bucket a rank, the step overlapped with DDP's
backward, a whole optimizer a rank where memory allows);
a sharded job's all-gathers and reduce-scatters are doctor.rules.shard_fixes', a pipeline's
sends and receives doctor.rules.comm_pipeline's. DDP's own fixes
(bucket size, no_sync, compression) are doctor.rules.communication's, for DDP's all-reduces
alone.

Each estimate is the share of the step a fix takes off: the exposed time of the collectives it
removes or hides, measured in the window, as a share of the rank's exposed communication, times
communication's share of the step (``share``, from the ledger)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from doctor.analyse.comms import RankComms
from doctor.analyse.parallelism import (
    GRADIENTS,
    OTHER,
    PIPELINE,
    SHARDED,
    STATS,
    TENSOR,
    ZERO,
)
from doctor.rules.window import speedup
from doctor.verdict import Fix

#: A role whose share of the exposed communication is at least this gets its fixes.
ROLE_SHARE = 0.1
WORDS = {SHARDED: "all-gathers and reduce-scatters of the sharded parameters",
         STATS: "small collectives of batch statistics (synchronised BatchNorm)",
         PIPELINE: "pipeline sends and receives", GRADIENTS: "gradient all-reduces",
         ZERO: "parameter broadcasts of a sharded optimizer (ZeRO-1)",
         TENSOR: "tensor parallel layers' collectives of activations",
         OTHER: "other collectives"}


@dataclass(frozen=True)
class Exposed:
    """The critical rank's exposed communication a window step, by role and, for a sharded
    job, by kind and phase."""

    total_s: float
    by_role: dict[str, float]
    calls: pd.DataFrame  # its collectives (role, kind, phase, unit, bytes, exposed_s)
    steps: int
    world: int

    def share(self, role: str) -> float:
        """The role's share of the exposed communication."""
        return self.by_role.get(role, 0.0) / self.total_s if self.total_s > 0 else 0.0

    def of(self, role: str, kind: str | None = None, phase: str | None = None) -> pd.DataFrame:
        c = self.calls[self.calls["role"] == role]
        if kind is not None:
            c = c[c["kind"] == kind]
        if phase is not None:
            c = c[c["phase"] == phase]
        return c


def exposed_by_role(comms: Mapping[int, RankComms] | None) -> Exposed | None:
    """The exposed communication of the rank with the most of it, by role (None: no
    collective has a role)."""
    best: Exposed | None = None
    for c in (comms or {}).values():
        calls = c.calls
        if calls.empty or "role" not in calls or c.steps <= 0:
            continue
        roles = {str(r): float(v) / c.steps
                 for r, v in calls.groupby("role")["exposed_s"].sum().items()}
        total = sum(roles.values())
        group = calls["group"][calls["group"] > 1]
        found = Exposed(total, roles, calls, c.steps, int(group.median()) if len(group) else 2)
        if best is None or total > best.total_s:
            best = found
    return best


def estimate_of(share: float, ex: Exposed, saved_s: float) -> float | None:
    """The speedup of taking ``saved_s`` of the exposed time a step off (None: under 2 %)."""
    if ex.total_s <= 0 or saved_s <= 0:
        return None
    value = speedup(1.0, share * min(saved_s, ex.total_s) / ex.total_s)
    return value if value >= 1.02 else None


def bucket_saving(calls: pd.DataFrame, world: int, steps: int) -> tuple[float, float] | None:
    """(the time of ``world`` broadcasts of the same bytes as a share of the ``n`` measured
    ones', their latency), from the broadcasts of a step: the latency, the median time of the
    smallest (up to twice the smallest size); the bandwidth, the best the larger ones reached
    beyond that latency.
    Medians and bests, not a fitted line: a call that waited for its peer stretches a line's
    latency, not these. None where every broadcast is of one size."""
    sized = calls[calls["bytes"].notna() & (calls["seconds"] > 0)]
    if sized.empty or steps <= 0:
        return None
    small = sized["bytes"] <= 2 * float(sized["bytes"].min())
    if small.all():
        return None
    alpha = float(sized.loc[small, "seconds"].median())
    large = sized[~small & (sized["seconds"] > alpha)]
    if large.empty:
        return None
    beta = float((large["bytes"] / (large["seconds"] - alpha)).max())
    n, total = len(calls) / steps, float(sized["bytes"].sum()) / steps
    now, then = n * alpha + total / beta, world * alpha + total / beta
    return (min(then / now, 1.0), alpha) if now > 0 else None


def stats_fixes(ex: Exposed, share: float) -> list[Fix]:
    """Synchronised batch statistics: plain BatchNorm where each rank's batch is large enough
    (the collectives gone), GroupNorm, or a larger batch a rank."""
    calls = ex.of(STATS)
    if calls.empty:
        return []
    saved = float(calls["exposed_s"].sum()) / ex.steps
    forward = ex.of(STATS, phase="forward")
    layers = len(forward) / ex.steps
    why = (f"{layers:g} small collectives of statistics a step in forward (one a synchronised "
           f"normalisation layer) and their backward, {saved * 1e3:.1f} ms exposed a step, each "
           "a round trip for a few KB: synchronising statistics pays where each rank's batch "
           "is too small for its own (under about 16-32 samples); above that, each rank's own "
           "are as good")
    if ex.share(GRADIENTS) > 0:
        why += ("; the estimate counts their own exposed time alone, a floor: the gradients' "
                "all-reduces, queued behind them in the one process group, then overlap "
                "backward too")
    return [
        Fix(title="Use plain BatchNorm where each rank's batch is large enough",
            why=why, code="model = torch.nn.SyncBatchNorm.revert_sync_batchnorm(model)  # or "
                          "build the model with nn.BatchNorm2d",
            estimated_speedup=estimate_of(share, ex, saved)),
        Fix(title="Normalise without batch statistics (GroupNorm)",
            why="GroupNorm normalises each sample on its own: no statistics to synchronise, "
                "and the same result at any batch size a rank",
            code="nn.GroupNorm(num_groups=32, num_channels=c)  # instead of a synchronised "
                 "BatchNorm2d(c)",
            estimated_speedup=estimate_of(share, ex, saved)),
        Fix(title="Train on a larger batch a rank",
            why="the statistics' collectives are the same whatever the batch: more samples a "
                "step pay them fewer times an epoch (with gradient accumulation where memory "
                "is short)",
            code="loader = DataLoader(dataset, batch_size=2 * batch_size, ...)"),
    ]


def all_to_all_fixes(ex: Exposed) -> list[Fix]:
    """All-to-all (sharded embeddings, mixture-of-experts dispatch) exposed: overlap it with the
    dense part (no estimate: how much the dense part can hide is not measured)."""
    calls = ex.of(OTHER, "alltoall")
    if calls.empty:
        return []
    exposed = float(calls["exposed_s"].sum()) / ex.steps
    return [Fix(
        title="Overlap the all-to-all with the dense part of the step",
        why=(f"{len(calls) / ex.steps:g} all-to-alls a step, {exposed * 1e3:.1f} ms exposed: "
             "sharded embeddings (or experts) exchange their rows with nothing to do beside "
             "them; a pipelined loop starts the next batch's exchange during this batch's "
             "dense forward and backward"),
        code=("from torchrec.distributed.train_pipeline import TrainPipelineSparseDist\n"
              "pipeline = TrainPipelineSparseDist(model, optimizer, device)\n"
              "for _ in range(steps):\n    pipeline.progress(data_iterator)"))]


def zero_fixes(ex: Exposed, share: float) -> list[Fix]:
    """A sharded optimizer's (ZeRO-1) parameter broadcasts: one bucket a rank instead of one
    broadcast a parameter, the step and its broadcasts overlapped with DDP's backward, or a
    whole optimizer on every rank where its state fits (the broadcasts gone, for (N-1)/N more
    optimizer state a rank and N times the optimizer's step).

    Estimates from the run: the bucket's, from a latency-bandwidth model of the broadcasts
    themselves (doctor.rules.comm_kinds.bucket_saving: N broadcasts of the same bytes against
    the n measured), of their exposed time. The whole optimizer's and the overlap's get none
    (N times the updates against the broadcasts: both run slower in the profiler window than
    outside it, by amounts that differ; what the overlap hides depends on DDP's buckets)."""
    calls = ex.of(ZERO)
    if calls.empty:
        return []
    exposed = float(calls["exposed_s"].sum()) / ex.steps
    n = len(calls) / ex.steps
    trip = float(calls["seconds"].median())
    out = []
    if n > 2 * ex.world:
        bucket = bucket_saving(calls, ex.world, ex.steps)
        why = (f"{n:g} broadcasts a step after the optimizer's step, one a parameter "
               f"({float(calls['bytes'].median()) / 1024:.1f} KiB median), "
               f"{exposed * 1e3:.1f} ms exposed: each pays a round trip (a median "
               f"{trip * 1e3:.2f} ms here); a bucket view sends each rank's shard as one "
               f"tensor, {ex.world} broadcasts a step")
        if bucket is not None:
            why += (f"; with the latency of the smallest ({bucket[1] * 1e3:.2f} ms a call) and "
                    f"the best bandwidth of the larger, the {ex.world} take {bucket[0]:.0%} of "
                    f"the {n:g}'s time")
        out.append(Fix(
            title="Broadcast one bucket a rank (parameters_as_bucket_view=True)", why=why,
            code=("ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,"
                  "\n    parameters_as_bucket_view=True, lr=lr)"),
            apply={"zero": {"parameters_as_bucket_view": True}},
            estimated_speedup=None if bucket is None else
            estimate_of(share, ex, exposed * (1.0 - bucket[0]))))
    out.append(Fix(
        title="Overlap the sharded step with DDP's backward (overlap_with_ddp=True)",
        why=("each rank steps its shard and broadcasts it after backward, with nothing beside "
             "it; with overlap_with_ddp, DDP's communication hook steps and broadcasts each "
             "bucket as soon as it is reduced"),
        code=("from torch.distributed.algorithms.ddp_comm_hooks.ddp_zero_hook import "
              "hook_with_zero_step\nfrom torch.distributed.algorithms.ddp_comm_hooks."
              "default_hooks import allreduce_hook\n"
              "zero = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim"
              ".Adam,\n    overlap_with_ddp=True, lr=lr)\n"
              "model.register_comm_hook(None, hook_with_zero_step(allreduce_hook, model, zero))")))
    out.append(Fix(
        title="Step a whole optimizer on each rank where its state fits",
        why=(f"the broadcasts ({exposed * 1e3:.1f} ms exposed a step) are the price of holding "
             f"1/{ex.world} of the optimizer state a rank; where memory allows, each rank "
             f"keeps all of it ({ex.world - 1}/{ex.world} more) and broadcasts nothing, for "
             f"{ex.world} times the updates a step (no estimate: the profiler window's many "
             "small broadcasts and updates both run slower than outside it, and by how much "
             "differs)"),
        code="optimizer = torch.optim.Adam(model.parameters(), lr=lr)  # instead of "
             "ZeroRedundancyOptimizer"))
    return out
