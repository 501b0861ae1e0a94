"""A CPU job whose step time goes to compute: a wide MLP on batches already in memory.

Switch: ``--small-model`` shrinks the model 16x, removing most of the compute, so the compute
share can be measured by ablation.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import StepTimer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--small-model", action="store_true", help="remove the bottleneck")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    width = args.width // 16 if args.small_model else args.width
    model = nn.Sequential(nn.Linear(256, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                          nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    n = args.batch * 16
    data = TensorDataset(torch.randn(n, 256), torch.randint(0, 10, (n,)))
    loader = DataLoader(data, batch_size=args.batch, shuffle=True, drop_last=True)
    timer = StepTimer()
    step = 0
    while step < args.steps:
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            timer.step()
            step += 1
            if step >= args.steps:
                break
    timer.report(job="compute_bound", small_model=args.small_model)


if __name__ == "__main__":
    main()
