"""A DDP job (gloo, CPU) whose normalisation layers synchronise their batch statistics across
ranks, as detectron2's NaiveSyncBatchNorm does (torch's nn.SyncBatchNorm runs on GPUs only): each
layer all-gathers its per-channel mean and mean square in forward, and all-reduces their
gradient in backward. On a per-rank batch of 2, those tiny collectives, one round trip each, are
much of the step.

Run it under torchrun: ``torchrun --nproc-per-node 2 sample_jobs/sync_stats.py``.

Switch: ``--plain-norm`` normalises with each rank's own statistics (plain BatchNorm): the same
work, without the statistics' collectives (DDP's gradient all-reduce stays). ``--ablate N``
times both in one process, in alternating blocks of N steps.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _ddp import start_gloo, train


class GatherStats(torch.autograd.Function):
    """Every rank's statistics, stacked; backward: the gradient summed over ranks, this
    rank's part."""

    @staticmethod
    def forward(ctx: Any, stats: torch.Tensor) -> torch.Tensor:
        out = [torch.empty_like(stats) for _ in range(dist.get_world_size())]
        dist.all_gather(out, stats.contiguous())
        return torch.stack(out)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous()
        dist.all_reduce(grad)
        return grad[dist.get_rank()]


class SyncStatsNorm(nn.Module):
    """Batch normalisation over the batches of every rank (``sync``) or of this rank alone."""

    def __init__(self, channels: int, sync: bool) -> None:
        super().__init__()
        self.sync = sync
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        stats = torch.cat([x.mean(0), (x * x).mean(0)])
        if self.sync:
            stats = GatherStats.apply(stats).mean(0)
        mean, meansqr = stats.chunk(2)
        var = (meansqr - mean * mean).clamp_min(0.0)
        return (x - mean) * torch.rsqrt(var + 1e-5) * self.weight + self.bias


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--batch", type=int, default=2, help="samples a rank")
    ap.add_argument("--plain-norm", action="store_true",
                    help="each rank's own statistics: no collective for them")
    ap.add_argument("--ablate", type=int, default=0,
                    help="alternate blocks of N steps with and without --plain-norm")
    args = ap.parse_args()
    rank = start_gloo()

    def build(sync: bool) -> nn.Module:
        layers: list[nn.Module] = []
        for _ in range(args.layers):
            layers += [nn.Linear(args.width, args.width), SyncStatsNorm(args.width, sync=sync),
                       nn.ReLU()]
        return DistributedDataParallel(nn.Sequential(*layers, nn.Linear(args.width, 10)))

    model = build(sync=not args.plain_norm)
    gen = torch.Generator().manual_seed(rank)
    data = [(torch.randn(args.batch, args.width, generator=gen),
             torch.randint(0, 10, (args.batch,), generator=gen)) for _ in range(8)]
    # the same layers with their own statistics, in alternating blocks: a model of its own (a
    # deep copy of the DDP model made the original's collectives 3x quicker than alone)
    switched = build(sync=False) if args.ablate > 0 else None
    train("sync_stats", model, data, args.steps, nn.functional.cross_entropy,
          ablate=args.ablate, switched=switched, plain_norm=args.plain_norm)

if __name__ == "__main__":
    main()
