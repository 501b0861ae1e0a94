"""A job under autocast and a GradScaler whose gradients overflow every few iterations: the
scaler skips those iterations' optimizer step, and their forward and backward are wasted.

Every ``--skip-every``-th iteration, a gradient in the backward pass is multiplied by inf
(standing in for an op whose gradient overflows the 16-bit range; ``--overflow loss``: the loss
itself, standing in for a forward pass that overflows), so the scaler finds inf/NaN gradients and
``scaler.step`` does not step. The model is ``--layers`` hidden blocks (``fcN`` Linear, ReLU)
and a ``head``; the gradient of block ``--overflow-at``'s output overflows, so ``fcN`` is the
layer whose gradients turn inf first (printed as ``overflow_layer``); ``--overflow output``: that
block's input is scaled up so that its fp16 output overflows in the forward pass. The forward
runs under ``torch.autocast(device, dtype=...)`` (``--device cpu``, the default, or ``cuda``;
``--autocast fp16``, the default, ``bf16`` or ``off``); ``--accumulate N`` runs N micro-batches
(backward() calls) per iteration. The job counts its iterations, the ones it skipped (the scale
drops at each one), their share of the loop's time, and its non-finite losses, and prints them,
with its last loss and a checksum of its weights (the same with and without doctor).

Switches: ``--skip-every 0`` removes the overflow (no iteration is skipped); ``--autocast off``
removes autocast's casts.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections import OrderedDict

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import StepTimer

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=90, help="iterations")
    ap.add_argument("--skip-every", type=int, default=3, help="overflow every N-th (0: never)")
    ap.add_argument("--overflow", choices=("grad", "loss", "output"), default="grad",
                    help="what overflows: a gradient in backward, the loss itself, or the "
                         "forward output of block --overflow-at (its input scaled by 1e5)")
    ap.add_argument("--autocast", choices=("fp16", "bf16", "off"), default="fp16")
    ap.add_argument("--accumulate", type=int, default=1, help="micro-batches per iteration")
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--layers", type=int, default=1, help="hidden blocks (Linear, ReLU)")
    ap.add_argument("--overflow-at", type=int, default=0,
                    help="the block whose output's gradient overflows (from 0)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="where the model trains (cuda: autocast and the scaler on the GPU)")
    args = ap.parse_args()
    torch.manual_seed(0)
    blocks: list[tuple[str, nn.Module]] = []
    for n in range(args.layers):
        blocks += [(f"fc{n}", nn.Linear(256 if n == 0 else args.width, args.width)),
                   (f"relu{n}", nn.ReLU())]
    model = nn.Sequential(OrderedDict([*blocks, ("head", nn.Linear(args.width, 10))]))
    model.to(args.device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    # growth_interval: long enough that the scale never grows back within the run
    scaler = torch.amp.GradScaler(args.device, init_scale=2.0**8, growth_interval=10**6)
    x, y = torch.randn(128, 256), torch.randint(0, 10, (128,))
    x, y = x.to(args.device), y.to(args.device)
    timer = StepTimer()
    skipped = nonfinite = 0
    skipped_s = loop_s = 0.0
    for i in range(args.steps):
        t0 = time.perf_counter()
        overflow = bool(args.skip_every) and i % args.skip_every == args.skip_every - 1
        opt.zero_grad(set_to_none=True)
        for _ in range(args.accumulate):
            with torch.autocast(args.device, dtype=DTYPES.get(args.autocast, torch.float32),
                                enabled=args.autocast != "off"):
                hidden = x
                for n in range(args.layers):
                    if overflow and args.overflow == "output" and n == args.overflow_at:
                        hidden = hidden * 1e5  # past fp16's 65504 in this block's output
                    hidden = model[2 * n + 1](model[2 * n](hidden))
                    if overflow and args.overflow == "grad" and n == args.overflow_at:
                        hidden.register_hook(lambda g: g * float("inf"))
                loss = nn.functional.cross_entropy(model.head(hidden), y) / args.accumulate
            if overflow and args.overflow == "loss":
                loss = loss * float("inf")
            nonfinite += not math.isfinite(loss.item())
            scaler.scale(loss).backward()
        before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        skip = scaler.get_scale() < before
        skipped += skip
        timer.step()
        spent = time.perf_counter() - t0
        loop_s += spent
        skipped_s += spent if skip else 0.0
    timer.report(job="amp_skips", skip_every=args.skip_every, autocast=args.autocast,
                 overflow=args.overflow, iterations=args.steps, skipped=skipped,
                 skipped_share=skipped_s / loop_s if loop_s else 0.0,
                 nonfinite_losses=nonfinite, micro_batches=args.accumulate,
                 final_scale=scaler.get_scale(), final_loss=loss.item(),
                 weights_sum=sum(float(p.detach().double().sum()) for p in model.parameters()),
                 overflow_layer=f"fc{args.overflow_at}")


if __name__ == "__main__":
    main()
