"""What the overflow watch (doctor.probes.overflow_watch) adds to a training iteration.

    python bench/overflow_watch_cost.py            # 5 rounds (--rounds N), 30 iterations a block

One process, a CPU model of ``--layers`` Linear layers (``--width`` wide) under fp16 autocast
and a GradScaler, one thread. Blocks alternate between four sides, each keeping its smallest
median iteration over the rounds:

* ``bare``: no probe;
* ``idle``: the steps probe, the watch not armed (what every job pays: nothing, it should read
  as bare);
* ``armed``: the watch armed through the whole block (its period made endless for the bench):
  a post-accumulate-grad hook per parameter appending its index, and a forward hook per module
  taking its output's smallest and largest value (doctor.probes.output_watch);
* ``flagged``: armed and flagging every iteration (what a skipped iteration, or every watched
  iteration of a fused optimizer, pays): each gradient's largest magnitude taken, stacked, read.

Prints one JSON line with the medians (ms) and each side's ratio to ``bare``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from doctor.probes import overflow_watch
from doctor.probes.steps import StepsProbe
from doctor.record.session import Session


def block(model: nn.Module, opt: Any, scaler: Any, x: torch.Tensor, n: int) -> float:
    """The median of ``n`` iterations, in seconds."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(x).float().pow(2).mean()
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--width", type=int, default=256)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(args.width, args.width) for _ in range(args.layers)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4, growth_interval=10**6)
    x = torch.randn(64, args.width)
    overflow_watch.WATCH_ITERATIONS = 10**9  # a period that lasts the block
    best: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        session = Session(Path(tmp), window_start=10**9)
        probe = StepsProbe(session)
        block(model, opt, scaler, x, 5)  # warm-up
        for _ in range(args.rounds):
            for side in ("bare", "idle", "armed", "flagged"):
                watch = None
                if side != "bare":
                    probe.start()
                    block(model, opt, scaler, x, 1)  # the optimizer seen stepping
                    watch = probe._overflow
                    assert watch is not None
                    if side != "idle":
                        watch._clean = True
                        watch._arm(every=side == "flagged")
                        assert watch.armed, session.probe_status
                took = block(model, opt, scaler, x, args.iterations)
                if watch is not None:
                    probe.stop()
                best[side] = min(best.get(side, took), took)
        session.close()
    print(json.dumps({
        "layers": args.layers, "width": args.width, "params": 2 * args.layers,
        "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
        **{f"{k}_ms": round(v * 1e3, 3) for k, v in best.items()},
        **{f"{k}_ratio": round(v / best["bare"], 3) for k, v in best.items() if k != "bare"}}))


if __name__ == "__main__":
    main()
