"""Shared by the DDP sample jobs (gloo, CPU, under torchrun): the process group, the model in
DDP or alone (``--no-allreduce``: each rank trains its own copy, so the communication share can
be measured by ablation), the settings line, and the timed loop."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import StepTimer

Batch = tuple[torch.Tensor, torch.Tensor]


def ddp_arguments(ap: argparse.ArgumentParser, steps: int = 30) -> None:
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--no-allreduce", action="store_true",
                    help="the same training without DDP: no all-reduce")


def run(job: str, model: nn.Module, batches: Callable[[int], list[Batch]],
        args: argparse.Namespace, bucket_cap_mb: float | None = None, **extra: object) -> None:
    """Train ``model`` for ``args.steps`` steps on the rank's batches (``batches(rank)``), in
    DDP with ``bucket_cap_mb`` unless ``--no-allreduce``; rank 0 prints the job's timing."""
    torch.set_num_threads(1)  # 2 ranks on a small machine: one thread each
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    kwargs = {"bucket_cap_mb": bucket_cap_mb} if bucket_cap_mb is not None else {}
    wrapped: nn.Module = model if args.no_allreduce else DistributedDataParallel(
        model, gradient_as_bucket_view=True, **kwargs)
    if rank == 0 and isinstance(wrapped, DistributedDataParallel):
        print(json.dumps({"settings": {
            "bucket_cap_mb": wrapped.bucket_bytes_cap / 2**20,
            "gradient_as_bucket_view": wrapped.gradient_as_bucket_view}}), flush=True)
    opt = torch.optim.SGD([p for p in wrapped.parameters() if p.requires_grad], lr=0.01)
    data = batches(rank)
    timer = StepTimer()
    for step in range(args.steps):
        x, y = data[step % len(data)]
        loss = nn.functional.cross_entropy(wrapped(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        timer.step()
    if rank == 0:
        timer.report(job=job, no_allreduce=args.no_allreduce,
                     world_size=dist.get_world_size(), **extra)
    dist.destroy_process_group()


def random_batches(rank: int, batch: int, width: int, n: int = 8) -> list[Batch]:
    gen = torch.Generator().manual_seed(rank)
    return [(torch.randn(batch, width, generator=gen),
             torch.randint(0, 10, (batch,), generator=gen)) for _ in range(n)]
