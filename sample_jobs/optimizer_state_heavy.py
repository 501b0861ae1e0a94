"""A CPU job whose memory goes to optimizer state: Adam on a large embedding table keeps two
moments per parameter (8 bytes beside the 4 of the weight and the 4 of its gradient).

Switch: ``--sgd`` trains it with plain SGD, which keeps no state.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _memory import print_expected, seed, tensor_bytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--sgd", action="store_true", help="remove the optimizer state")
    ap.add_argument("--device", default="cpu", help="cuda: the same on a GPU")
    args = ap.parse_args()
    seed()
    device = torch.device(args.device)
    model = nn.Sequential(nn.Embedding(args.rows, args.dim), nn.Linear(args.dim, 1)).to(device)
    params = list(model.parameters())
    opt = (torch.optim.SGD(params, lr=0.01) if args.sgd else torch.optim.Adam(params, lr=1e-3))
    # Adam: exp_avg and exp_avg_sq as large as each parameter, and a 4-byte step count each
    # (a CPU scalar, also for parameters on a GPU)
    print_expected(parameters_bytes=tensor_bytes(params),
                   optimizer_state_bytes=0 if args.sgd else
                   2 * tensor_bytes(params) + 4 * len(params))
    for _ in range(args.steps):
        ids = torch.randint(0, args.rows, (args.batch,), device=device)
        loss = model(ids).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
