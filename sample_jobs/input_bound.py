"""A CPU job whose step time goes to preparing input: each sample is built by a slow pure-Python
transform inside ``__getitem__``, and the model is a small MLP (``--hidden``).

Switch: ``--cached`` builds every sample once before training, removing the bottleneck, so the
input share can be measured by ablation. ``--workers N`` sets DataLoader num_workers.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _loop import add_ablation_arg, fit_job
from _timing import plan, side_lengths

FEATURES = 64


def slow_transform(i: int, work: int) -> list[float]:
    """Deliberately slow per-sample feature building in pure Python."""
    out = []
    for j in range(FEATURES):
        acc = 0.0
        for k in range(work):
            acc += math.sin(i * 0.001 + j * 0.01 + k * 1e-4)
        out.append(acc / work)
    return out


class SlowDataset(Dataset):
    def __init__(self, n: int, work: int, cached: bool) -> None:
        self.n, self.work = n, work
        self.cache = [self._build(i) for i in range(n)] if cached else None

    def _build(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.tensor(slow_transform(i, self.work)), i % 10

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.cache[i] if self.cache is not None else self._build(i)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--work", type=int, default=150, help="inner loop length per feature")
    ap.add_argument("--hidden", type=int, default=1536,
                    help="MLP width: the compute part (20-30 %% of the step, --workers 0)")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--cached", action="store_true", help="remove the bottleneck")
    add_ablation_arg(ap)
    args = ap.parse_args()
    torch.set_num_threads(1)  # the model is tiny: one thread is plenty, and steadier
    torch.manual_seed(0)
    # each block starts at sample 0: a side's data (and cache) needs its longest block's samples
    lengths = side_lengths(plan(args.steps, args.ablate, args.cached, args.switch_after)[1])

    def loader(cached: bool) -> DataLoader:
        n = args.batch * lengths[cached]
        return DataLoader(SlowDataset(n, args.work, cached), batch_size=args.batch,
                          shuffle=False, num_workers=args.workers)

    model = nn.Sequential(nn.Linear(FEATURES, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, 10))
    fit_job(args, args.cached, loader, model).report(job="input_bound", cached=args.cached,
                                                     workers=args.workers)


if __name__ == "__main__":
    main()
