"""A GPU job whose step time goes to host-to-device copies from pageable memory.

Big batches (about 77 MB each) live in ordinary host memory and are copied to the GPU with a
blocking ``.to(device)`` every step, for a small model: the copy dominates the step.

Switch: ``--fixed`` pins the batches (what ``pin_memory=True`` on the DataLoader does) and copies
with ``non_blocking=True`` one batch ahead, so the copy overlaps the previous step's kernels.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _gpu import require_cuda
from _timing import StepTimer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=25.0, help="stop after this long")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--fixed", action="store_true", help="remove the bottleneck")
    args = ap.parse_args()
    require_cuda("gpu_pageable_copy")

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset

    class Batches(Dataset[tuple[torch.Tensor, torch.Tensor]]):
        """Whole batches prepared up front, so loading costs nothing and only the copy remains."""

        def __init__(self, n: int, pin: bool) -> None:
            self.items = [
                (torch.randn(args.batch, 3, 224, 224), torch.randint(0, 10, (args.batch,)))
                for _ in range(n)
            ]
            if pin:
                self.items = [(x.pin_memory(), y.pin_memory()) for x, y in self.items]

        def __len__(self) -> int:
            return len(self.items)

        def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
            return self.items[i]

    torch.manual_seed(0)
    device = torch.device("cuda")
    model = nn.Sequential(nn.Conv2d(3, 8, 7, stride=8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(8, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # batch_size=None: the dataset yields whole batches; pin_memory is a no-op on pinned tensors
    loader = DataLoader(Batches(8, pin=args.fixed), batch_size=None, shuffle=False,
                        pin_memory=args.fixed)
    timer = StepTimer()
    deadline = time.perf_counter() + args.seconds
    step = 0
    while step < args.steps and time.perf_counter() < deadline:
        batches = iter(loader)
        nxt = next(batches)
        if args.fixed:
            nxt = tuple(t.to(device, non_blocking=True) for t in nxt)
        for cpu_batch in batches:
            if args.fixed:
                x, y = nxt
                nxt = tuple(t.to(device, non_blocking=True) for t in cpu_batch)
            else:
                x, y = (t.to(device) for t in nxt)
                nxt = cpu_batch
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            timer.step()
            step += 1
            if step >= args.steps or time.perf_counter() >= deadline:
                break
    torch.cuda.synchronize()
    timer.report(job="gpu_pageable_copy", fixed=args.fixed)


if __name__ == "__main__":
    main()
