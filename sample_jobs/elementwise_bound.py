"""A CPU job whose compute is memory-bound: a chain of per-feature scale, shift and activation
layers on a large batch. Each layer reads and writes the whole activation tensor to do a few
operations per element, far below the machine's ridge point.

Switch: ``--matmul`` replaces the chain by as many dense layers of the same width: the same
tensors, now matrix products, compute-bound.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _memory import seed


class ScaleShift(nn.Module):
    """y = gelu(x * scale + shift): elementwise only."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(width))
        self.shift = nn.Parameter(torch.zeros(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.gelu(x * self.scale + self.shift)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--matmul", action="store_true", help="dense layers instead")
    args = ap.parse_args()
    seed()
    layers = [nn.Linear(args.width, args.width) if args.matmul else ScaleShift(args.width)
              for _ in range(args.depth)]
    model = nn.Sequential(*layers, nn.Linear(args.width, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(args.batch, args.width), torch.randint(0, 10, (args.batch,))
    for _ in range(args.steps):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
