"""A CPU job whose DataLoader workers' memory grows: the dataset holds its samples as a Python
list of lists of floats. A forked worker shares the parent's pages until it writes to them, and
reading a Python object writes its reference count, so each worker copies the pages of every
sample it reads (copy-on-read): its own memory grows towards the dataset's size.

Switch: ``--arrays`` holds the same samples in one numpy array: reading it writes nothing.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _memory import print_expected, resident_bytes, seed


def normalise(row: list[float], passes: int) -> list[float]:
    """Per-sample Python work (the same on both sides of the switch)."""
    for _ in range(passes):
        mean = sum(row) / len(row)
        row = [v - mean for v in row]
    return row


class ListRows(Dataset):
    def __init__(self, rows: int, width: int, passes: int) -> None:
        self.rows = [[float(i + j) for j in range(width)] for i in range(rows)]
        self.passes = passes

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor(normalise(self.rows[i], self.passes))


class ArrayRows(Dataset):
    def __init__(self, rows: int, width: int, passes: int) -> None:
        self.rows = np.arange(rows, dtype=np.float32)[:, None] + np.arange(width,
                                                                          dtype=np.float32)
        self.passes = passes

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor(normalise(self.rows[i].tolist(), self.passes))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--width", type=int, default=8)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--passes", type=int, default=12, help="per-sample Python work")
    ap.add_argument("--arrays", action="store_true", help="remove the growth")
    args = ap.parse_args()
    seed()
    before = resident_bytes()
    data = (ArrayRows if args.arrays else ListRows)(args.rows, args.width, args.passes)
    # the pages the samples fill: what a worker copies as it reads them all
    print_expected(dataset_bytes=resident_bytes() - before, python_objects=not args.arrays)
    loader = DataLoader(data, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                        drop_last=True)
    model = nn.Linear(args.width, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    for _ in range(args.epochs):
        for x in loader:
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    print("done", flush=True)


if __name__ == "__main__":
    main()
