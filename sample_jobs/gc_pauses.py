"""A CPU job paused by Python's garbage collector: it holds a large heap of Python objects (a
tokenised corpus as lists and dicts, as many datasets and caches are), and each step keeps its
own records (cyclic: each points back at its batch) for a few steps. Those records outlive the
young collections, and every so often a full collection scans the whole heap, pausing a step
for many times its length.

Switch: ``--freeze`` does what doctor's fix says: ``gc.freeze()`` after setup (what is alive
then is never scanned again), ``gc.disable()``, and ``gc.collect()`` every ``--collect-every``
steps: a collection at a step of the job's choosing, which scans only what the steps made.

The job times the collector's pauses itself (its own ``gc.callbacks``) and prints them with its
step times, one JSON line at the end: ``gc_pause_s`` (every collection), ``gc_full`` (full
collections), ``gc_share`` (their pause over the loop's time).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from collections import deque
from typing import Any

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import StepTimer


class GcTimer:
    """The collector's pauses, timed with gc.callbacks (in this process, as doctor's probe)."""

    def __init__(self) -> None:
        self.pause_s = 0.0
        self.full = 0
        self.collections = 0
        self._t0 = 0.0
        gc.callbacks.append(self.callback)

    def callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        self.pause_s += time.perf_counter() - self._t0
        self.collections += 1
        self.full += info["generation"] == 2


def corpus(docs: int) -> list[dict[str, Any]]:
    """A heap of Python objects that lives the whole run: ``docs`` documents of token lists."""
    return [{"id": i, "tokens": [i % 97, i % 89, i % 83, i % 79], "meta": {"len": 4}}
            for i in range(docs)]


def step_records(step: int, n: int) -> list[Any]:
    """What a step keeps a while (metrics, per-sample logs): ``n`` records, each in a cycle."""
    batch: list[Any] = []
    for i in range(n):
        record: dict[str, Any] = {"step": step, "i": i, "batch": batch}
        batch.append(record)
    return batch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--docs", type=int, default=600_000,
                    help="documents of the heap that lives the whole run (3 objects each)")
    ap.add_argument("--records", type=int, default=20_000, help="records a step keeps")
    ap.add_argument("--keep", type=int, default=4, help="steps a step's records are kept")
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--freeze", action="store_true",
                    help="remove the bottleneck: gc.freeze() and gc.disable() after setup, "
                         "gc.collect() on a schedule")
    ap.add_argument("--collect-every", type=int, default=20)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    heap = corpus(args.docs)
    model = nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU(),
                          nn.Linear(args.width, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, args.width), torch.randint(0, 10, (64,))
    if args.freeze:
        gc.collect()
        gc.freeze()
        gc.disable()
    kept: deque[list[Any]] = deque(maxlen=args.keep)
    timing = GcTimer()
    timer = StepTimer()
    for step in range(args.steps):
        t0 = time.perf_counter()
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        kept.append(step_records(step, args.records))
        if args.freeze and step % args.collect_every == args.collect_every - 1:
            gc.collect()
        timer.train(time.perf_counter() - t0)
        timer.step()
    gc.callbacks.remove(timing.callback)
    loop_s = time.perf_counter() - timer.t_start
    timer.report(gc_pause_s=round(timing.pause_s, 4), gc_full=timing.full,
                 gc_collections=timing.collections, gc_share=round(timing.pause_s / loop_s, 4),
                 heap_objects=len(heap) * 3, frozen=args.freeze)


if __name__ == "__main__":
    main()
