"""A DDP job (gloo, CPU) whose step time goes to the gradient all-reduce: a large embedding with
dense gradients and a tiny model behind it, so every step all-reduces the whole table while the
forward and backward do almost nothing.

Run it under torchrun: ``torchrun --nproc-per-node 2 sample_jobs/ddp_allreduce_bound.py``.

Switches: ``--small-grads`` freezes the embedding table (``requires_grad=False``): the same
lookups and the same small model, but only the small model's gradients are all-reduced (and the
table's gradient is not computed, nor stepped). ``--skip-allreduce`` keeps DDP and every
computation and skips the all-reduce alone (a communication hook that reduces nothing), so the
communication share can be measured by ablation; ``--no-allreduce`` drops DDP altogether (each
rank trains its own copy), which also removes DDP's own work on the training thread.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _ddp import Batch, ddp_arguments, run


class Model(nn.Module):
    def __init__(self, rows: int, dim: int, frozen: bool) -> None:
        super().__init__()
        self.embedding = nn.Embedding(rows, dim)  # dense gradients: the whole table every step
        self.embedding.weight.requires_grad_(not frozen)
        self.head = nn.Sequential(nn.Linear(dim, 32), nn.ReLU(), nn.Linear(32, 10))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.embedding(idx).mean(dim=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ddp_arguments(ap, steps=30)
    ap.add_argument("--rows", type=int, default=100_000, help="embedding rows")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--small-grads", action="store_true", help="remove the bottleneck")
    args = ap.parse_args()
    torch.manual_seed(0)

    def batches(rank: int) -> list[Batch]:
        gen = torch.Generator().manual_seed(rank)
        return [(torch.randint(0, args.rows, (args.batch, 8), generator=gen),
                 torch.randint(0, 10, (args.batch,), generator=gen)) for _ in range(8)]

    # gradients as views of DDP's buckets (_ddp.run): no copy between them, so what is left is
    # the all-reduce itself and the optimizer's pass over the table
    run("ddp_allreduce_bound", Model(args.rows, args.dim, args.small_grads), batches, args,
        small_grads=args.small_grads)


if __name__ == "__main__":
    main()
