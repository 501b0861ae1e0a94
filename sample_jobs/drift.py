"""A CPU job whose bottleneck changes as it runs: compute first (a small MLP over samples held in
memory), then, after ``--slow-after`` seconds, the input slows down: each sample is first read
from a slow source, a pipe that a feeder thread fills with one sample's bytes every
``--read-ms`` (a device of fixed bandwidth, as a cold cache or a busy network filesystem is), so
``__getitem__`` blocks in ``os.read``, and the job becomes input-bound.

Switch: ``--no-drift`` keeps the input fast for the whole run (one bottleneck, compute).

At the end it prints its own timing as one JSON line (with ``median_step_s`` and ``loop_s``, as
the other jobs' for bench/overhead.py): the step at which the input slowed down, and for the
steps before and after it, the median step and the share of the step spent waiting
for the DataLoader, as the job's own clock measured them (what doctor's periods are checked
against).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

FEATURES = 256


SAMPLE_BYTES = 4 * FEATURES


class SlowSource:
    """A pipe that a feeder thread fills with SAMPLE_BYTES every ``read_s`` once started."""

    def __init__(self, read_s: float) -> None:
        self.read_s = read_s
        self.fd, self._write_fd = os.pipe()

    def start(self) -> None:
        threading.Thread(target=self._feed, name="slow-source", daemon=True).start()

    def _feed(self) -> None:
        chunk = bytes(SAMPLE_BYTES)
        while True:
            time.sleep(self.read_s)
            os.write(self._write_fd, chunk)


class DriftingDataset(Dataset):
    """Samples in memory; once ``source`` is set, each is first read from it (blocking)."""

    def __init__(self, n: int) -> None:
        seed = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, FEATURES, generator=seed)
        self.y = torch.randint(0, 10, (n,), generator=seed)
        self.source: SlowSource | None = None

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.source is not None:
            got = 0
            while got < SAMPLE_BYTES:
                got += len(os.read(self.source.fd, SAMPLE_BYTES - got))
        return self.x[i], self.y[i]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=20.0, help="how long the job trains")
    ap.add_argument("--steps", type=int, default=0, help="or how many steps (0: --seconds)")
    ap.add_argument("--slow-after", type=float, default=8.0,
                    help="seconds after the first step at which the input slows down")
    ap.add_argument("--read-ms", type=float, default=2.5, help="each slow sample's read")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--no-drift", action="store_true", help="remove the drift")
    ap.add_argument("--device", default="cpu", help="where the model runs (cuda: a GPU job)")
    args = ap.parse_args()
    data = DriftingDataset(args.batch * 64)
    source = SlowSource(args.read_ms / 1e3)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    loader = DataLoader(data, batch_size=args.batch, shuffle=True, num_workers=0)
    model = nn.Sequential(nn.Linear(FEATURES, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, 10)).to(args.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    steps: list[tuple[float, float]] = []  # (step s, of which waiting for the batch s)
    switch_step = None
    start = time.perf_counter()
    last = start
    def done(now: float) -> bool:
        return len(steps) >= args.steps if args.steps else now - start >= args.seconds

    while not done(last):
        for x, y in _timed(loader, steps):
            opt.zero_grad()
            loss_fn(model(x.to(args.device)), y.to(args.device)).backward()
            opt.step()
            if args.device != "cpu":
                torch.cuda.synchronize()  # the step's own time, as the job's clock sees it
            now = time.perf_counter()
            steps[-1] = (now - last, steps[-1][1])
            last = now
            if switch_step is None and not args.no_drift and now - start >= args.slow_after:
                source.start()
                data.source, switch_step = source, len(steps)
            if done(now):
                break
    walls = [s for s, _ in steps[len(steps) // 5:]]
    print(json.dumps({"job": "drift", "steps": len(steps), "switch_step": switch_step,
                      "median_step_s": statistics.median(walls) if walls else None,
                      "loop_s": last - start,
                      **_side("before", steps[5:switch_step]),
                      **_side("after", steps[switch_step:] if switch_step else [])}),
          flush=True)


def _timed(loader: DataLoader, steps: list[tuple[float, float]]):  # type: ignore[no-untyped-def]
    """The loader's batches, each wait for one appended to ``steps`` as (0, wait)."""
    it = iter(loader)
    while True:
        t0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            return
        steps.append((0.0, time.perf_counter() - t0))
        yield batch


def _side(name: str, steps: list[tuple[float, float]]) -> dict[str, float | None]:
    if not steps:
        return {f"{name}_median_step_s": None, f"{name}_input_share": None}
    total = sum(s for s, _ in steps)
    return {f"{name}_median_step_s": statistics.median(s for s, _ in steps),
            f"{name}_input_share": sum(w for _, w in steps) / total if total else None}


if __name__ == "__main__":
    main()
