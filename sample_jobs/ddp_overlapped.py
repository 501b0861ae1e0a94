"""A DDP job (gloo, CPU) whose all-reduce is small beside its compute: a wide MLP on a large
batch, so backward takes far longer than moving its few MB of gradients, which DDP all-reduces
bucket by bucket while backward goes on. Communication should not be the bottleneck.

Run it under torchrun: ``torchrun --nproc-per-node 2 sample_jobs/ddp_overlapped.py``.

Switch: ``--skip-allreduce`` keeps DDP and skips its all-reduces (a communication hook that
reduces nothing): the step should barely change. ``--no-allreduce`` drops DDP altogether.
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
    ddp_arguments(ap, steps=20)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=2048)
    args = ap.parse_args()
    torch.manual_seed(0)
    w = args.width
    model = nn.Sequential(nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(),
                          nn.Linear(w, 10))
    run("ddp_overlapped", model, lambda r: random_batches(r, args.batch, w), args,
        bucket_cap_mb=1.0)


if __name__ == "__main__":
    main()
