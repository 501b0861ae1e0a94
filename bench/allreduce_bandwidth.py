"""The bus bandwidth doctor reports for an all-reduce against a bare timing loop of the same size.

Two ranks (gloo, this machine's loopback), in one run of this script:

1. bare: ``torch.distributed.all_reduce`` of a float32 tensor of ``--numel`` elements, timed
   ``--repeats`` times after warm-up (a barrier before each, so the ranks start together);
2. under doctor: ``sample_jobs/ddp_allreduce_bound.py``, whose one DDP bucket holds the same
   number of elements by default (the embedding table and the small head: 6,402,410), run by
   ``doctor run -- torchrun``; the bus bandwidth of its all-reduces is read from
   ``verdict.json`` (``communication``, per rank).

Both use nccl-tests' bus bandwidth (all-reduce: 2(n-1)/n x bytes / time; 1x for two ranks).
The bare figure is the median over the repeats, the doctor figure the median over the
window's all-reduces of each rank.

    python bench/allreduce_bandwidth.py [--numel 6402410] [--repeats 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_NUMEL = 100_000 * 64 + 64 * 32 + 32 + 32 * 10 + 10  # ddp_allreduce_bound's bucket


def bare_worker(numel: int, repeats: int) -> None:
    """One rank of the bare loop (run by torchrun): prints rank 0's timings as JSON."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    x = torch.ones(numel, dtype=torch.float32)
    for _ in range(3):
        dist.all_reduce(x)
    seconds = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(x)
        seconds.append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        print(json.dumps({"seconds": seconds, "world": dist.get_world_size()}))
    dist.destroy_process_group()


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", *args]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--numel", type=int, default=DEFAULT_NUMEL)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--steps", type=int, default=40, help="steps of the doctor run")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        bare_worker(args.numel, args.repeats)
        return
    nbytes = args.numel * 4
    out = subprocess.run(torchrun(__file__, "--worker", "--numel", str(args.numel),
                                  "--repeats", str(args.repeats)),
                         capture_output=True, text=True, check=True, cwd=ROOT)
    bare = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("{")))
    n = bare["world"]
    factor = 2 * (n - 1) / n
    bare_bus = [nbytes / s * factor for s in bare["seconds"]]
    with tempfile.TemporaryDirectory(prefix="doctor-allreduce-") as tmp:
        run_dir = Path(tmp) / "run"
        subprocess.run([sys.executable, "-m", "doctor.cli", "run", "--out", str(run_dir), "--",
                        *torchrun(str(ROOT / "sample_jobs" / "ddp_allreduce_bound.py"),
                                  "--steps", str(args.steps))],
                       capture_output=True, text=True, check=True, cwd=ROOT,
                       env={**os.environ})
        verdict = json.loads((run_dir / "verdict.json").read_text())
    ranks = verdict.get("communication") or []
    print(f"all-reduce of {args.numel:,} float32 ({nbytes / 2**20:.1f} MiB), {n} ranks, gloo "
          f"over loopback, {os.cpu_count()} cores")
    print(f"  bare loop ({args.repeats} timed): bus bandwidth median "
          f"{statistics.median(bare_bus) / 1e9:.3f} GB/s "
          f"({min(bare_bus) / 1e9:.3f}..{max(bare_bus) / 1e9:.3f})")
    for r in ranks:
        for k in r["by_kind"]:
            if k["kind"] != "allreduce":
                continue
            per_call = (k["bytes"] or 0) / max(k["calls"], 1)
            bus = k["bus_gb_per_s"] * 1e9 if k["bus_gb_per_s"] is not None else None
            ratio = bus / statistics.median(bare_bus) if bus else float("nan")
            print(f"  doctor, rank {r['rank']}: {k['calls']} all-reduces of "
                  f"{per_call / 2**20:.1f} MiB, bus bandwidth median {bus / 1e9:.3f} GB/s "
                  f"= {ratio:.2f}x the bare loop's; exposed {k['exposed_s'] * 1e3:.1f} ms, "
                  f"class {k['bound']}")


if __name__ == "__main__":
    main()
