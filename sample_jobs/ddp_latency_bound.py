"""A DDP job (gloo, CPU) whose step time goes to the latency of many small all-reduces: a deep
stack of tiny layers (hundreds of small parameters) and a bucket cap so small that DDP
all-reduces nearly every parameter on its own, each call paying a round trip for a few KB.

Run it under torchrun: ``torchrun --nproc-per-node 2 sample_jobs/ddp_latency_bound.py``.

Switches: ``--bucket-cap-mb 25`` (DDP's default) packs the same gradients into one bucket: the
same bytes in one call. ``--skip-allreduce`` keeps DDP and skips its all-reduces (a
communication hook that reduces nothing); ``--no-allreduce`` drops DDP (each rank trains alone).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _ddp import ddp_arguments, random_batches, run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ddp_arguments(ap, steps=30)
    ap.add_argument("--layers", type=int, default=150)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--bucket-cap-mb", type=float, default=0.001,
                    help="DDP's bucket cap (tiny: about one bucket per parameter)")
    args = ap.parse_args()
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.width, args.width), nn.Tanh()]
    model = nn.Sequential(*layers, nn.Linear(args.width, 10))
    run("ddp_latency_bound", model, lambda r: random_batches(r, args.batch, args.width), args,
        bucket_cap_mb=args.bucket_cap_mb)


if __name__ == "__main__":
    main()
