"""A nanoGPT-style CPU job that builds its batches itself, with no DataLoader: ``get_batch()``
picks random windows of a token file opened with ``np.memmap`` and turns each into features with
per-token Python work, then a tiny model trains on them.

Switch: ``--prebatched`` builds all batches before the loop, removing the bottleneck, so the share
of input built outside a DataLoader can be measured by ablation (``--ablate BLOCK``: both sides in
one process, alternating).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _loop import add_ablation_arg
from _timing import plan, side_lengths

VOCAB = 256


def get_batch(data: np.memmap, batch: int, block: int, rng: np.random.Generator
              ) -> tuple[torch.Tensor, torch.Tensor]:
    starts = rng.integers(0, len(data) - block - 1, size=batch)
    rows = []
    for s in starts:
        window = data[s:s + block + 1]
        # per-token feature work in Python: the deliberately slow part
        rows.append([sum((int(t) * k + j) % VOCAB for k in range(1, 33)) % VOCAB
                     for j, t in enumerate(window)])
    arr = torch.tensor(rows)
    return arr[:, :-1], arr[:, 1:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--prebatched", action="store_true", help="remove the bottleneck")
    add_ablation_arg(ap)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tokens.bin")
        rng.integers(0, VOCAB, size=2_000_000, dtype=np.uint16).tofile(path)
        data = np.memmap(path, dtype=np.uint16, mode="r")
        timer, sides = plan(args.steps, args.ablate, args.prebatched, args.switch_after)
        ready = side_lengths(sides).get(True, 0)  # batches the prebatched side needs
        pre = [get_batch(data, args.batch, args.block, rng) for _ in range(ready)]
        model = nn.Sequential(nn.Embedding(VOCAB, 32), nn.Linear(32, VOCAB))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for prebatched, length in sides:
            timer.start_block(prebatched)
            for step in range(length):
                x, y = pre[step] if prebatched else get_batch(data, args.batch, args.block, rng)
                t0 = time.perf_counter()
                loss = nn.functional.cross_entropy(model(x).view(-1, VOCAB), y.reshape(-1))
                opt.zero_grad()
                loss.backward()
                opt.step()
                timer.train(time.perf_counter() - t0)
                timer.step()
        timer.report(job="get_batch_bound", prebatched=args.prebatched)


if __name__ == "__main__":
    main()
