"""How the merge (analysis) of a distributed run grows with the number of ranks.

For each size, writes a synthetic run directory of RANKS x STEPS through real Sessions driven by a
fake clock (the same ring files a job writes: loader waits, backward, optimizer steps; one rank
slower than the others), then analyses it and renders the HTML report in a fresh process, and
prints the analysis time, the report time and the peak memory of that process.

    python bench/merge_scale.py                      # 8 16 32 64 128 256 ranks x 1000 steps
    python bench/merge_scale.py --ranks 8 64 --steps 2000
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write_run(run_dir: Path, ranks: int, steps: int) -> None:
    from doctor.record.session import Session
    from doctor.store.rundir import write_run_record

    slow_rank = ranks // 3
    for rank in range(ranks):
        now = [10**12]

        def clock(now: list[int] = now) -> int:
            return now[0]

        session = Session(run_dir, rank=rank, clock=clock, window_start=10**9)
        loader = session.record_loader({"num_workers": 0, "batch_size": 32})
        wait_ns = 4_000_000 if rank == slow_rank else 1_000_000
        for _ in range(steps):
            t0 = now[0]
            now[0] += wait_ns
            session.record_interval("loader_wait", t0, now[0], loader)
            now[0] += 8_000_000
            b0 = now[0]
            now[0] += 10_000_000
            session.record_interval("backward", b0, now[0])
            session.record_optimizer_start()
            now[0] += 2_000_000
            session.record_optimizer_end(0)
        session.close()
    write_run_record(run_dir, {"argv": ["python", "train.py"], "name": "synthetic",
                               "t0_monotonic_s": 1000.0, "cores": 64, "exit_code": 0})


def measure(run_dir: Path) -> dict[str, float]:
    """In this (fresh) process: analyse and render, and how long and how much memory it took."""
    from doctor.pipeline import analyze_run
    from doctor.reports.html import render_html

    base_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    analysis = analyze_run(run_dir)
    t1 = time.perf_counter()
    render_html(analysis)
    t2 = time.perf_counter()
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"analyse_s": t1 - t0, "render_s": t2 - t1, "peak_rss_mb": peak_kb / 1024,
            "growth_mb": (peak_kb - base_kb) / 1024, "rows": len(analysis.ledger)}


def disk_mb(run_dir: Path) -> float:
    return sum(p.stat().st_blocks * 512 for p in run_dir.rglob("*") if p.is_file()) / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 16, 32, 64, 128, 256])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure is not None:
        print(json.dumps(measure(args.measure)))
        return
    print(f"{'ranks':>6} {'steps':>6} {'write s':>8} {'analyse s':>10} {'report s':>9} "
          f"{'peak MB':>8} {'+MB':>6} {'disk MB':>8}")
    for ranks in args.ranks:
        with tempfile.TemporaryDirectory(prefix="doctor-merge-") as tmp:
            run_dir = Path(tmp)
            t0 = time.perf_counter()
            write_run(run_dir, ranks, args.steps)
            write_s = time.perf_counter() - t0
            out = subprocess.run([sys.executable, __file__, "--measure", str(run_dir)],
                                 capture_output=True, text=True, cwd=ROOT, check=True)
            got = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{ranks:>6} {args.steps:>6} {write_s:>8.2f} {got['analyse_s']:>10.2f} "
                  f"{got['render_s']:>9.2f} {got['peak_rss_mb']:>8.0f} "
                  f"{got['growth_mb']:>6.0f} {disk_mb(run_dir):>8.1f}", flush=True)


if __name__ == "__main__":
    main()
