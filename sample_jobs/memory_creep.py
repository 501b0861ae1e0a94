"""A CPU job whose memory grows every step: it scores a held-out batch each step with autograd
on and sums the score as a tensor (``val_total += loss_fn(model(xv), yv)``), so every step's
graph, with the activations it saved, stays alive.

Switch: ``--item`` sums ``.item()`` instead (a Python float): memory stays flat.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _memory import mlp, mlp_saved_bytes, print_expected, seed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--val-batch", type=int, default=256)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--item", action="store_true", help="remove the leak")
    ap.add_argument("--device", default="cpu", help="cuda: the same on a GPU")
    args = ap.parse_args()
    seed()
    device = torch.device(args.device)
    model = mlp(256, args.width, args.depth, 10).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(args.batch, 256, device=device)
    y = torch.randint(0, 10, (args.batch,), device=device)
    xv = torch.randn(args.val_batch, 256, device=device)
    yv = torch.randint(0, 10, (args.val_batch,), device=device)
    print_expected(kept_per_step_bytes=0 if args.item else mlp_saved_bytes(
        args.val_batch, 256, args.width, args.depth, 10))
    val_total: float | torch.Tensor = 0.0
    for _ in range(args.steps):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        val = nn.functional.cross_entropy(model(xv), yv)  # autograd on: a graph is built
        val_total += val.item() if args.item else val
    total = val_total.detach().item() if isinstance(val_total, torch.Tensor) else val_total
    print(f"mean held-out loss {total / args.steps:.3f}")


if __name__ == "__main__":
    main()
