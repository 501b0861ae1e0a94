"""A CPU job whose DataLoader workers keep up on average but not in bursts: one batch in
``--every`` takes ``--slow`` times as long to load (a slow read from a remote store, sleeping,
not computing), the others a millisecond of CPU; the workers take the slow batches in turn, and
each keeps up on average. Two workers with the default
``prefetch_factor=2`` have four batches in flight: a slow batch drains that queue and the loop
waits, while most steps wait not at all. The model is a small MLP (``--hidden``).

Switch: ``--deep-queue`` sets ``prefetch_factor=--deep`` (default 8): the queue holds enough
batches to ride out a slow one, the fix for bursts (more workers are the fix for a loader that
is slow on average).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _loop import add_ablation_arg, fit_job

FEATURES = 256


class BurstyDataset(Dataset):
    """Sample ``i`` of batch ``i // batch``: a little CPU work, and for one batch in ``every``
    a wait of ``slow_s`` split over its samples."""

    def __init__(self, n: int, batch: int, every: int, base_s: float, slow_s: float) -> None:
        self.n, self.batch, self.every = n, batch, every
        self.base_s, self.slow_s = base_s / batch, slow_s / batch

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        end = time.perf_counter() + self.base_s
        x = torch.zeros(FEATURES)
        while time.perf_counter() < end:  # the ordinary sample's CPU work
            x = (x + 1.0).sin_()
        if (i // self.batch) % self.every == self.every - 1:
            time.sleep(self.slow_s)  # the slow batch: waiting on storage, not computing
        return x, i % 10


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--every", type=int, default=11,
                    help="one batch in this many is slow (odd: the workers take turns)")
    ap.add_argument("--base-ms", type=float, default=1.0, help="an ordinary batch's loading")
    ap.add_argument("--slow", type=float, default=100.0,
                    help="a slow batch takes this many times an ordinary one")
    ap.add_argument("--hidden", type=int, default=2048, help="MLP width: the compute part")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader num_workers")
    ap.add_argument("--deep", type=int, default=8, help="prefetch_factor with --deep-queue")
    ap.add_argument("--deep-queue", action="store_true",
                    help="prefetch_factor=--deep: removes the waits")
    add_ablation_arg(ap)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    n = args.batch * args.steps
    base = args.base_ms / 1e3

    def loader(deep: bool) -> DataLoader:
        data = BurstyDataset(n, args.batch, args.every, base, base * args.slow)
        extra = {"prefetch_factor": args.deep if deep else 2} if args.workers else {}
        return DataLoader(data, batch_size=args.batch, shuffle=False,
                          num_workers=args.workers, persistent_workers=args.workers > 0,
                          **extra)

    model = nn.Sequential(nn.Linear(FEATURES, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, 10))
    timer = fit_job(args, args.deep_queue, loader, model)
    timer.report(job="bursty_loader", deep_queue=args.deep_queue, workers=args.workers)


if __name__ == "__main__":
    main()
