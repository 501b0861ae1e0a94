"""A DDP job (gloo, CPU) with one slow rank: that rank's input pipeline does extra pure-Python
work for every sample, so each step the other ranks wait for it in the gradient all-reduce.

Run it under torchrun: ``torchrun --nproc-per-node 2 sample_jobs/ddp_slow_rank.py``.

Switch: ``--balanced`` gives every rank the same (cheap) input, removing the straggler.
``--slow-rank R`` picks the slow rank (default: the last one); ``--slow-in compute`` puts the
extra work in the slow rank's forward pass instead of its input. ``--crash-at N`` makes the slow
rank raise an exception at step N (to test partial reports).
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import StepTimer

FEATURES = 128


def busy_python(seed: int, work: int) -> float:
    """Deliberately slow pure-Python arithmetic: the slow rank's extra work."""
    acc = 0.0
    for k in range(work):
        acc += math.sin(seed * 0.001 + k * 1e-4)
    return acc / max(work, 1)


class Samples(Dataset):
    def __init__(self, n: int, work: int) -> None:
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, FEATURES, generator=gen)
        self.y = torch.randint(0, 10, (n,), generator=gen)
        self.work = work

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.x[i]
        if self.work:
            x = x + busy_python(i, self.work)
        return x, self.y[i]


class Model(nn.Module):
    def __init__(self, width: int, extra_work: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, width), nn.ReLU(),
                                 nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))
        # a plain tensor, neither a parameter nor a buffer: DDP neither reduces nor broadcasts it
        self.extra = torch.randn(width, width) / width
        self.extra_work = extra_work

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.net[:4](x)
        if self.extra_work:
            with torch.no_grad():  # the slow rank's extra compute: no gradients, no parameters
                z = h.detach()
                for _ in range(self.extra_work):
                    z = torch.tanh(z @ self.extra)
            h = h + 0.0 * z
        return self.net[4:](h)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--work", type=int, default=1500, help="extra inner loop per sample")
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--slow-in", choices=("input", "compute"), default="input")
    ap.add_argument("--balanced", action="store_true", help="remove the straggler")
    ap.add_argument("--crash-at", type=int, default=0, help="the slow rank raises at step N")
    args = ap.parse_args()
    torch.set_num_threads(1)  # 2 ranks on a small machine: one thread each
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    slow = not args.balanced and rank == args.slow_rank % world
    torch.manual_seed(0)
    extra_compute = args.work // 15 if slow and args.slow_in == "compute" else 0
    model = DistributedDataParallel(Model(args.width, extra_compute))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    input_work = args.work if slow and args.slow_in == "input" else 0
    data = Samples(args.batch * args.steps, input_work)
    loader = DataLoader(data, batch_size=args.batch, shuffle=False, num_workers=0)
    timer = StepTimer()
    for step, (x, y) in enumerate(loader, start=1):
        if slow and args.crash_at and step == args.crash_at:
            raise RuntimeError(f"rank {rank} failed on purpose at step {step}")
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        timer.step()
    if rank == 0:
        timer.report(job="ddp_slow_rank", balanced=args.balanced, slow_in=args.slow_in,
                     world_size=world)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
