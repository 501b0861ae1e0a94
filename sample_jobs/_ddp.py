"""Shared by the DDP sample jobs (gloo, CPU, under torchrun): the process group, the model in
DDP, the settings line, and the timed loop.

Two ablations: ``--skip-allreduce`` keeps DDP as it is (its hooks, its buckets, the gradients as
views of them) and registers a communication hook that hands each bucket back unreduced: the
collectives alone are gone, so the communication share is measured by it. ``--no-allreduce``
drops DDP altogether (each rank trains its own copy): that also removes DDP's own work on the
training thread, more than its communication.

Gradient accumulation: ``--accumulate M`` runs M micro-batches (backward() calls) a step, each
all-reducing its gradients as DDP does by default; ``--no-sync`` wraps the first M-1 in
``model.no_sync()`` (one all-reduce a step, the same optimizer step); ``--ablate N`` times both in
one process, in alternating blocks of N steps (the same model: only no_sync() differs)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import StepTimer, plan

Batch = tuple[torch.Tensor, torch.Tensor]


def ddp_arguments(ap: argparse.ArgumentParser, steps: int = 30) -> None:
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--no-allreduce", action="store_true",
                    help="the same training without DDP: no all-reduce")
    ap.add_argument("--skip-allreduce", action="store_true",
                    help="DDP as it is, but its buckets are not all-reduced")
    ap.add_argument("--accumulate", type=int, default=1, help="micro-batches a step")
    ap.add_argument("--no-sync", action="store_true",
                    help="the first micro-batches of a step in model.no_sync()")
    ap.add_argument("--ablate", type=int, default=0,
                    help="alternate blocks of N steps without and with --no-sync")


def run(job: str, model: nn.Module, batches: Callable[[int], list[Batch]],
        args: argparse.Namespace, bucket_cap_mb: float | None = None, **extra: object) -> None:
    """Train ``model`` for ``args.steps`` steps on the rank's batches (``batches(rank)``), in
    DDP with ``bucket_cap_mb`` unless ``--no-allreduce``; rank 0 prints the job's timing."""
    rank = start_gloo()
    kwargs = {"bucket_cap_mb": bucket_cap_mb} if bucket_cap_mb is not None else {}
    wrapped: nn.Module = model if args.no_allreduce else DistributedDataParallel(
        model, gradient_as_bucket_view=True, **kwargs)
    if args.skip_allreduce and isinstance(wrapped, DistributedDataParallel):
        wrapped.register_comm_hook(None, _unreduced)
    if rank == 0 and isinstance(wrapped, DistributedDataParallel):
        print(json.dumps({"settings": {
            "bucket_cap_mb": wrapped.bucket_bytes_cap / 2**20,
            "gradient_as_bucket_view": wrapped.gradient_as_bucket_view}}), flush=True)
    no_sync_on = (True,) if args.ablate > 0 else (False, True) if args.no_sync else ()
    if args.accumulate > 1:
        extra.update(micro_batches=args.accumulate, no_sync=args.no_sync)
    train(job, wrapped, batches(rank), args.steps, nn.functional.cross_entropy,
          ablate=args.ablate, accumulate=args.accumulate, no_sync_on=no_sync_on,
          no_allreduce=args.no_allreduce, skip_allreduce=args.skip_allreduce, **extra)


def start_gloo() -> int:
    """One thread for torch (2 ranks on a small machine), the gloo process group, the same
    model's seed on every rank; this rank."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    return dist.get_rank()


def train(job: str, model: nn.Module, data: list[Batch], steps: int,
          loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], *, ablate: int = 0,
          switched: nn.Module | None = None, accumulate: int = 1,
          no_sync_on: tuple[bool, ...] = (), **extra: object) -> None:
    """Train ``model`` (already wrapped, in an initialised process group) for ``steps`` steps on
    ``data``, ``accumulate`` micro-batches a step; rank 0 prints the job's timing with
    ``extra``; the process group is destroyed. ``ablate`` N > 0: blocks of N steps alternate
    between ``model`` and ``switched`` (the job with its switch), both timed in one process
    (_timing.AblationTimer). ``no_sync_on``: the sides (False: the job, True: the switched)
    whose first micro-batches of a step run in DDP's no_sync()."""
    rank = dist.get_rank()
    models = {False: model, True: switched if switched is not None else model}
    opts = {side: torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.01)
            for side, m in models.items()}
    timer, blocks = plan(steps, ablate, False)
    step = 0
    for side, length in blocks:
        timer.start_block(side)
        for _ in range(length):
            opts[side].zero_grad()
            for i in range(accumulate):
                x, y = data[(step * accumulate + i) % len(data)]
                quiet = side in no_sync_on and i < accumulate - 1 and \
                    isinstance(models[side], DistributedDataParallel)
                with models[side].no_sync() if quiet else contextlib.nullcontext():
                    loss = loss_fn(models[side](x), y)
                    (loss / accumulate if accumulate > 1 else loss).backward()
            opts[side].step()
            timer.step()
            step += 1
    if ablate > 0:
        if rank == 0:
            timer.report(job=job, world_size=dist.get_world_size(), **extra)
        dist.destroy_process_group()
        return
    assert isinstance(timer, StepTimer)
    # without the collectives the ranks no longer wait for each other: the job goes at the pace
    # of its slowest rank, which is what an ablation compares
    steady = timer.steps[len(timer.steps) // 5:] or timer.steps
    medians: list[float | None] = [None] * dist.get_world_size()
    dist.all_gather_object(medians, statistics.median(steady) if steady else None)
    if rank == 0:
        timer.report(job=job, world_size=dist.get_world_size(),
                     slowest_median_step_s=max(m for m in medians if m is not None), **extra)
    dist.destroy_process_group()


def _unreduced(_state, bucket):  # type: ignore[no-untyped-def]
    """A DDP communication hook that does no communication: the bucket as it is (unannotated:
    DDP refuses annotations that are not its own classes, and strings are not)."""
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def random_batches(rank: int, batch: int, width: int, n: int = 8) -> list[Batch]:
    gen = torch.Generator().manual_seed(rank)
    return [(torch.randn(batch, width, generator=gen),
             torch.randint(0, 10, (batch,), generator=gen)) for _ in range(n)]
