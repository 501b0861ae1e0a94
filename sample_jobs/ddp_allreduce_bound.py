"""A DDP job (gloo, CPU) whose step time goes to the gradient all-reduce: a large embedding with
dense gradients and a tiny model behind it, so every step all-reduces the whole table while the
forward and backward do almost nothing.

Run it under torchrun: ``torchrun --nproc-per-node 2 sample_jobs/ddp_allreduce_bound.py``.

Switches: ``--small-grads`` freezes the embedding table (``requires_grad=False``): the same
lookups and the same small model, but only the small model's gradients are all-reduced (and the
table's gradient is not computed, nor stepped). ``--no-allreduce`` keeps every computation and
drops the all-reduce alone: each rank trains its own copy, without DDP, so the communication
share can be measured by ablation.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import StepTimer


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
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rows", type=int, default=100_000, help="embedding rows")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--small-grads", action="store_true", help="remove the bottleneck")
    ap.add_argument("--no-allreduce", action="store_true",
                    help="the same training without DDP: no all-reduce")
    args = ap.parse_args()
    torch.set_num_threads(1)  # 2 ranks on a small machine: one thread each
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    # gradients as views of DDP's buckets: no copy between them, so what is left is the
    # all-reduce itself and the optimizer's pass over the table
    local = Model(args.rows, args.dim, args.small_grads)
    model: nn.Module = local if args.no_allreduce else DistributedDataParallel(
        local, gradient_as_bucket_view=True)
    if rank == 0 and isinstance(model, DistributedDataParallel):
        # the settings as the job runs with them (what a doctor try changed shows)
        print(json.dumps({"settings": {
            "bucket_cap_mb": model.bucket_bytes_cap / 2**20,
            "gradient_as_bucket_view": model.gradient_as_bucket_view}}), flush=True)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    batches = [(torch.randint(0, args.rows, (args.batch, 8), generator=gen),
                torch.randint(0, 10, (args.batch,), generator=gen)) for _ in range(8)]
    timer = StepTimer()
    for step in range(args.steps):
        idx, y = batches[step % len(batches)]
        loss = nn.functional.cross_entropy(model(idx), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        timer.step()
    if rank == 0:
        timer.report(job="ddp_allreduce_bound", small_grads=args.small_grads,
                     no_allreduce=args.no_allreduce, world_size=dist.get_world_size())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
