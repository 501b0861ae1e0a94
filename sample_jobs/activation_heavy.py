"""A CPU job whose memory goes to activations: a deep, narrow MLP on a large batch keeps far
more bytes for backward (each layer's output, batch x width) than its weights take.

Switch: ``--checkpoint`` recomputes the activations in backward (activation checkpointing in
``--segments`` segments): only each segment's input is kept, about 1/segments of them.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint_sequential

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _memory import mlp, mlp_saved_bytes, print_expected, seed, tensor_bytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--depth", type=int, default=16)
    ap.add_argument("--checkpoint", action="store_true", help="remove the bottleneck")
    ap.add_argument("--segments", type=int, default=4)
    ap.add_argument("--device", default="cpu", help="cuda: the same on a GPU")
    args = ap.parse_args()
    seed()
    device = torch.device(args.device)
    model = mlp(args.width, args.width, args.depth, 10).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(args.batch, args.width, device=device)
    y = torch.randint(0, 10, (args.batch,), device=device)
    print_expected(parameters_bytes=tensor_bytes(model.parameters()),
                   activations_bytes=None if args.checkpoint else mlp_saved_bytes(
                       args.batch, args.width, args.width, args.depth, 10))
    for _ in range(args.steps):
        if args.checkpoint:
            out = checkpoint_sequential(model, args.segments, x, use_reentrant=False)
        else:
            out = model(x)
        loss = nn.functional.cross_entropy(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
