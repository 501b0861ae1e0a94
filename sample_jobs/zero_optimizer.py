"""A DDP job (gloo, CPU) whose optimizer state is sharded across ranks with torch's
``ZeroRedundancyOptimizer`` (ZeRO stage 1): each rank updates its share of the parameters, then
every parameter is broadcast from the rank that owns it. On a model of many small layers, those
broadcasts, one a parameter, each a round trip, follow every optimizer step with nothing beside
them.

Run it under torchrun: ``torchrun --nproc-per-node 2 sample_jobs/zero_optimizer.py``.

Switches: ``--plain-optimizer`` steps a whole Adam on every rank (no broadcast: each rank holds
all the optimizer state); ``--bucket-view`` (``parameters_as_bucket_view=True``) broadcasts one
bucket a rank instead of one tensor a parameter. ``--ablate N`` times the job and the job with
its switch in one process, in alternating blocks of N steps.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _ddp import random_batches, start_gloo
from _timing import plan


def optimizer(model: nn.Module, plain: bool, bucket_view: bool) -> torch.optim.Optimizer:
    if plain:
        return torch.optim.Adam(model.parameters(), lr=1e-3)
    return ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                   parameters_as_bucket_view=bucket_view, lr=1e-3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--plain-optimizer", action="store_true", help="no ZeRO: a whole Adam a rank")
    ap.add_argument("--bucket-view", action="store_true", help="parameters_as_bucket_view=True")
    ap.add_argument("--ablate", type=int, default=0,
                    help="alternate blocks of N steps without and with the switch")
    args = ap.parse_args()
    rank = start_gloo()
    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    model = DistributedDataParallel(nn.Sequential(*layers, nn.Linear(args.width, 10)))
    sides = {False: optimizer(model, args.plain_optimizer and args.ablate <= 0,
                              args.bucket_view and args.ablate <= 0)}
    if args.ablate > 0:
        sides[True] = optimizer(model, args.plain_optimizer, args.bucket_view)
    data = random_batches(rank, args.batch, args.width)
    timer, blocks = plan(args.steps, args.ablate, False)
    step = 0
    for side, length in blocks:
        timer.start_block(side)
        for _ in range(length):
            x, y = data[step % len(data)]
            loss = nn.functional.cross_entropy(model(x), y)
            sides[side].zero_grad()
            loss.backward()
            sides[side].step()
            timer.step()
            step += 1
    if rank == 0:
        timer.report(job="zero_optimizer", world_size=torch.distributed.get_world_size(),
                     plain_optimizer=args.plain_optimizer, bucket_view=args.bucket_view)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
