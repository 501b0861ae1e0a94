"""A tensor parallel job (gloo, CPU; DTensor's ``parallelize_module``): MLP blocks whose first
layer is column-parallel and second row-parallel over the ranks, as Megatron-style tensor
parallelism splits them. Every rank takes the same batch; each block all-reduces its output in
forward and its input gradient in backward: on a small model those collectives of activations,
one round trip each, are much of the step.

Run it under torchrun: ``torchrun --nproc-per-node 2 sample_jobs/tensor_parallel.py``.

Switch: ``--data-parallel`` trains the same model whole on each rank under DDP, each rank on
1/world of the batch (the same global batch; the same work a rank); the activations'
collectives are gone, DDP's gradient all-reduce comes. ``--ablate N`` times both in one
process, in alternating blocks of N steps. ``--compile`` compiles the tensor-parallel model
(torch.compile traces through DTensor: its host work a step is gone; the first steps compile).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _ddp import start_gloo, train


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64, help="the global batch")
    ap.add_argument("--data-parallel", action="store_true",
                    help="DDP over the whole model, 1/world of the batch a rank")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the tensor-parallel model (DTensor traced through)")
    ap.add_argument("--ablate", type=int, default=0,
                    help="alternate blocks of N steps with and without --data-parallel")
    args = ap.parse_args()
    rank = start_gloo()
    world = dist.get_world_size()

    def model() -> nn.Sequential:
        torch.manual_seed(0)  # the same weights on every rank
        layers: list[nn.Module] = []
        for _ in range(args.blocks):
            layers += [nn.Linear(args.width, args.hidden), nn.ReLU(),
                       nn.Linear(args.hidden, args.width)]
        return nn.Sequential(*layers, nn.Linear(args.width, 10))

    def tensor_parallel() -> nn.Module:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        mesh = init_device_mesh("cpu", (world,))
        plan = {}
        for b in range(args.blocks):
            plan[str(3 * b)] = ColwiseParallel()
            plan[str(3 * b + 2)] = RowwiseParallel()
        built = parallelize_module(model(), mesh, plan)
        return torch.compile(built) if args.compile else built

    gen = torch.Generator().manual_seed(0)  # the same global batches on every rank
    whole = [(torch.randn(args.batch, args.width, generator=gen),
              torch.randint(0, 10, (args.batch,), generator=gen)) for _ in range(8)]
    share = args.batch // world
    mine = [(x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share])
            for x, y in whole]
    def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(out, y[:out.shape[0]])  # labels for its rows

    if args.ablate > 0:
        # train() feeds both sides one list: the data-parallel side takes its rank's slice of
        # each global batch itself
        tp, dp = tensor_parallel(), DistributedDataParallel(model())
        train("tensor_parallel", Sliced(tp, None), whole, args.steps, loss_fn,
              ablate=args.ablate, switched=Sliced(dp, (rank * share, (rank + 1) * share)),
              data_parallel=args.data_parallel)
        return
    built = DistributedDataParallel(model()) if args.data_parallel else tensor_parallel()
    train("tensor_parallel", built, mine if args.data_parallel else whole, args.steps, loss_fn,
          data_parallel=args.data_parallel)


class Sliced(nn.Module):
    """``model`` on the rows ``rows`` of the batch (None: all of it)."""

    def __init__(self, model: nn.Module, rows: tuple[int, int] | None) -> None:
        super().__init__()
        self.model = model
        self.rows = rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x if self.rows is None else x[self.rows[0]:self.rows[1]])


if __name__ == "__main__":
    main()
