"""A CPU job fed by a loader of its own, not a DataLoader: a background thread builds each batch
(per-sample augmentation in numpy and Python: crops, flips, a blur as shifted sums, the
normalisation) and puts it on a ``queue.Queue``; the training loop takes batches with
``queue.get()`` and waits there while the thread cannot keep up (MONAI's ThreadDataLoader and
many hand-written loaders work this way). The model is a small MLP (``--hidden``).

Switch: ``--prebuilt`` builds every distinct batch once before training; the thread then only
hands them over, so the loop never waits on the queue.
"""

from __future__ import annotations

import argparse
import queue
import threading
import time

import numpy as np
import torch
from torch import nn

SIDE = 32


def augment(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A random crop and flip, a 3x3 blur as shifted sums, per-channel normalisation."""
    x, y = (int(v) for v in rng.integers(0, img.shape[0] - SIDE - 2, 2))
    out = img[x:x + SIDE + 2, y:y + SIDE + 2].astype(np.float32)
    if rng.random() < 0.5:
        out = out[:, ::-1]
    blur = sum(out[i:i + SIDE, j:j + SIDE] for i in range(3) for j in range(3)) / 9.0
    return ((blur - blur.mean(axis=(0, 1))) / (blur.std(axis=(0, 1)) + 1e-6)).ravel()


def make_batch(images: np.ndarray, batch: int, rng: np.random.Generator
               ) -> tuple[torch.Tensor, torch.Tensor]:
    picks = rng.integers(0, len(images), batch)
    x = np.stack([augment(images[i], rng) for i in picks])
    return torch.from_numpy(x), torch.from_numpy(picks % 10)


def producer(out: queue.Queue, images: np.ndarray, batch: int, steps: int,
             prebuilt: list | None) -> None:
    rng = np.random.default_rng(1)
    for i in range(steps):
        out.put(prebuilt[i % len(prebuilt)] if prebuilt else make_batch(images, batch, rng))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=256, help="MLP width: the compute part")
    ap.add_argument("--prebuilt", action="store_true",
                    help="build the batches before training: removes the wait")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    images = np.random.default_rng(0).integers(0, 256, (64, 48, 48, 3), dtype=np.uint8)
    rng = np.random.default_rng(2)
    prebuilt = [make_batch(images, args.batch, rng) for _ in range(8)] if args.prebuilt \
        else None
    batches: queue.Queue = queue.Queue(maxsize=4)
    threading.Thread(target=producer, args=(batches, images, args.batch, args.steps, prebuilt),
                     daemon=True).start()
    model = nn.Sequential(nn.Linear(SIDE * SIDE * 3, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    steps, waits = [], []
    last = time.perf_counter()
    for _ in range(args.steps):
        t = time.perf_counter()
        x, y = batches.get()
        waits.append(time.perf_counter() - t)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        now = time.perf_counter()
        steps.append(now - last)
        last = now
    print({"median_step_s": float(np.median(steps)), "wait_share": sum(waits) / sum(steps),
           "job": "thread_loader", "prebuilt": args.prebuilt})


if __name__ == "__main__":
    main()
