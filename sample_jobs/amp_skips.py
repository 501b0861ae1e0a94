"""A CPU job under a GradScaler whose gradients overflow every few iterations: the scaler skips
those iterations' optimizer step, and their forward and backward are wasted.

Every ``--skip-every``-th iteration's loss is multiplied by inf (standing in for an op that
overflows the 16-bit range), so its gradients are not finite and ``scaler.step`` does not step.
The job counts the iterations it skipped itself (the scale drops at each one) and prints them.

Switch: ``--skip-every 0`` removes the overflow: no iteration is skipped.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import StepTimer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=90, help="iterations")
    ap.add_argument("--skip-every", type=int, default=3, help="overflow every N-th (0: never)")
    ap.add_argument("--width", type=int, default=512)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, args.width), nn.ReLU(), nn.Linear(args.width, 10))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    # growth_interval: long enough that the scale never grows back within the run
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=10**6)
    x, y = torch.randn(128, 256), torch.randint(0, 10, (128,))
    timer = StepTimer()
    skipped = 0
    for i in range(args.steps):
        loss = nn.functional.cross_entropy(model(x), y)
        if args.skip_every and i % args.skip_every == args.skip_every - 1:
            loss = loss * float("inf")
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        skipped += scaler.get_scale() < before
        timer.step()
    timer.report(job="amp_skips", skip_every=args.skip_every, iterations=args.steps,
                 skipped=skipped)


if __name__ == "__main__":
    main()
