"""A CPU job whose step time goes to compute: a wide MLP on batches already in memory.

Switch: ``--small-model`` shrinks the model 16x, removing most of the compute, so the compute
share can be measured by ablation (``--ablate BLOCK``: both sides in one process, alternating).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _loop import add_ablation_arg, print_settings
from _timing import plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--small-model", action="store_true", help="remove the bottleneck")
    add_ablation_arg(ap)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    n = args.batch * 16
    data = TensorDataset(torch.randn(n, 256), torch.randint(0, 10, (n,)))
    loader = DataLoader(data, batch_size=args.batch, shuffle=True, drop_last=True)
    print_settings(loader)
    timer, sides = plan(args.steps, args.ablate, args.small_model, args.switch_after)
    models = {small: mlp(args.width // 16 if small else args.width)
              for small in {s for s, _ in sides}}
    optimizers = {small: torch.optim.SGD(m.parameters(), lr=0.01) for small, m in models.items()}
    for small, length in sides:
        timer.start_block(small)
        model, opt = models[small], optimizers[small]
        step = 0
        while step < length:
            for x, y in loader:
                loss = nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                timer.step()
                step += 1
                if step >= length:
                    break
    timer.report(job="compute_bound", small_model=args.small_model)


def mlp(width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(256, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))

if __name__ == "__main__":
    main()
