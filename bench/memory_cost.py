"""What doctor's memory accounting costs, measured side by side in one process.

1. Saved-tensor accounting (doctor.probes.saved_tensors), on for the profiler window's steps
   only: training steps of a model alternate in blocks with the counter on and off; the ratio
   of the median step with it to the median step without is its cost. Two models: a wide MLP
   (few, large saved tensors: the usual case) and a deep, narrow one on a small batch (hundreds
   of small saved tensors a step: the worst case for a Python call per tensor).
2. Allocator sampling (doctor.probes.memory) at step boundaries: what the step listener adds to
   every step (ns), and what one snapshot costs (the statistics' dict, here a fake one with the
   real key names, since this machine has no GPU, and the JSON line appended to the file).
3. A process's own memory (smaps_rollup), read by the parent for DataLoader workers: ms per
   read by the process's resident size, and the share of a core the schedule allows.

    python bench/memory_cost.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch
from torch import nn

from doctor.machine import private_bytes, rss_bytes
from doctor.probes.host import PRIVATE_COST_RATIO, PRIVATE_MIN_S
from doctor.probes.memory import MemoryProbe
from doctor.probes.saved_tensors import SavedTensorCounter
from doctor.record.session import Session


def mlp(width_in: int, width: int, depth: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(depth):
        layers += [nn.Linear(width_in if i == 0 else width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def saved_tensor_cost(model: nn.Module, batch: int, width_in: int, rounds: int, block: int
                      ) -> tuple[float, list[float], int]:
    """(median of the rounds' on/off ratios, the ratios, saved tensors a step)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(batch, width_in), torch.randint(0, 10, (batch,))

    def step() -> float:
        t0 = time.perf_counter()
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return time.perf_counter() - t0

    for _ in range(block):
        step()  # warm-up
    ratios, tensors = [], 0
    for _ in range(rounds):
        off = [step() for _ in range(block)]
        counter = SavedTensorCounter(torch, model.parameters())
        counter.start()
        on = []
        try:
            for _ in range(block):
                on.append(step())
                counter.step()
        finally:
            counter.stop()
        off += [step() for _ in range(block)]
        tensors = counter.steps[-1][1]
        ratios.append(statistics.median(on) / statistics.median(off))
    return statistics.median(ratios), ratios, tensors


class _FakeCuda:
    """torch.cuda's surface the memory probe reads, with the real statistics' key names."""

    def __init__(self) -> None:
        self.stats = {f"{k}.{pool}.{stat}": 1 << 30 for k in (
            "allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes",
            "requested_bytes", "allocation", "segment", "active", "inactive_split")
            for pool in ("all", "large_pool", "small_pool")
            for stat in ("current", "peak", "allocated", "freed")}
        self.stats.update(num_alloc_retries=0, num_ooms=0, num_sync_all_streams=0)

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def current_device(self) -> int:
        return 0

    def memory_stats(self, device: int) -> dict[str, int]:
        return dict(self.stats)  # torch builds a fresh dict of ~110 keys each call

    def get_device_properties(self, device: int) -> SimpleNamespace:
        return SimpleNamespace(total_memory=80 << 30)


def allocator_sampling_cost(steps: int) -> tuple[float, float, int]:
    """(ns the listener adds to a step between snapshots, median µs of a snapshot, snapshots
    in ``steps`` steps of 1 ms, a fast GPU step)."""
    fake = SimpleNamespace(cuda=_FakeCuda(), version=SimpleNamespace(cuda="12.4"),
                           _C=SimpleNamespace())
    with tempfile.TemporaryDirectory() as tmp:
        bare = Session(Path(tmp) / "bare", rank=0)
        session = Session(Path(tmp) / "run", rank=0)
        probe = MemoryProbe(session, fake)
        probe.start()
        session.count_step(2)  # the first snapshot (and the process folder)
        probe._next_step = 1 << 62  # between snapshots: the listener's comparison only
        loops = 200_000
        per_step = []
        for _ in range(5):
            t0 = time.perf_counter_ns()
            for _ in range(loops):
                bare.count_step(2)
            t1 = time.perf_counter_ns()
            for _ in range(loops):
                session.count_step(2)
            t2 = time.perf_counter_ns()
            per_step.append(((t2 - t1) - (t1 - t0)) / loops)
        probe.stop()
        session.close()
        session = Session(Path(tmp) / "snapshots", rank=0)
        probe = MemoryProbe(session, fake)
        probe.start()
        snaps = []
        for _ in range(steps):
            rows = probe.rows
            s0 = time.perf_counter_ns()
            session.count_step(2)
            if probe.rows != rows:
                snaps.append(time.perf_counter_ns() - s0)
            deadline = time.perf_counter_ns() + 1_000_000
            while time.perf_counter_ns() < deadline:
                pass
        probe.stop()
        session.close()
    return max(statistics.median(per_step), 0.0), statistics.median(snaps) / 1e3, len(snaps)


def private_read_cost(sizes_mb: list[int]) -> list[tuple[int, float, float]]:
    """(resident MB, ms per smaps_rollup read of a forked child that size, interval s)."""
    out = []
    for mb in sizes_mb:
        block = bytearray(mb << 20)  # touched: resident
        for i in range(0, len(block), 4096):
            block[i] = 1
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.read(r, 1)
            os._exit(0)
        reads = []
        for _ in range(5):
            c0 = time.thread_time()
            private_bytes(pid)
            reads.append(time.thread_time() - c0)
        os.write(w, b"x")
        os.waitpid(pid, 0)
        cost = statistics.median(reads)
        out.append((int(rss_bytes() / 2**20), cost * 1e3, max(PRIVATE_MIN_S,
                                                               cost * PRIVATE_COST_RATIO)))
        del block
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--block", type=int, default=20)
    args = ap.parse_args()
    torch.manual_seed(0)
    print("1. saved-tensor accounting, window steps on/off (median of rounds, range):")
    for name, model, batch, width_in in (
            ("wide MLP 256-1024x3, batch 64", mlp(256, 1024, 3), 64, 256),
            ("deep MLP 32x100, batch 8", mlp(32, 32, 100), 8, 32)):
        ratio, ratios, tensors = saved_tensor_cost(model, batch, width_in, args.rounds,
                                                   args.block)
        print(f"   {name:32s} {tensors:4d} saved tensors/step  {ratio:.3f}x  "
              f"({min(ratios):.3f}-{max(ratios):.3f})")
    listener_ns, snap_us, snaps = allocator_sampling_cost(3000)
    print(f"2. allocator sampling: {listener_ns:.0f} ns added to a step between snapshots; "
          f"{snap_us:.0f} us a snapshot (fake statistics of the real shape; {snaps} in 3000 "
          "steps of 1 ms: about one a second)")
    print("3. own-memory reads (parent side), by resident size of the process read:")
    for mb, ms, interval in private_read_cost([100, 400, 1600]):
        print(f"   {mb:5d} MB resident: {ms:.2f} ms a read; alone, read every {interval:.1f} s: "
              f"{ms / 1e3 / interval:.2%} of a core (every worker's reads together stay under "
              f"{1 / PRIVATE_COST_RATIO:.1%})")


if __name__ == "__main__":
    main()
