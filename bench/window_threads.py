"""The deep window's cost on a job with many threads, by how its stacks are sampled.

A training loop (a small MLP, SGD, for ``--seconds``; with so many intra-op threads and idle
Python threads beside it, ``--jobs``) records each step's start and duration itself. It runs bare,
then under ``doctor run`` with py-spy forced to pause the process for every sample
(``DOCTOR_STACKS=blocking``, doctor's behaviour before the per-process plan), then with the plan
doctor chooses. For each run: the median step while py-spy sampled the training process against
the median step outside the window and the sampling (after warm-up), the steps the run got
through in its ``--seconds`` against the bare run's (the whole window's cost, amortised over
the run), the seconds doctor run took beyond the bare run (start-up, the window's close, the
report), and the plan recorded in stacks.json.

    python bench/window_threads.py                      # 32 intra-op, then 64 idle threads
    python bench/window_threads.py --jobs 1:64 --seconds 30
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

JOB = textwrap.dedent("""
    import json, os, sys, threading, time
    import torch
    torch_threads, idle, seconds, out = (int(sys.argv[1]), int(sys.argv[2]),
                                         float(sys.argv[3]), sys.argv[4])
    torch.set_num_threads(torch_threads)
    stop = threading.Event()
    for _ in range(idle):
        threading.Thread(target=stop.wait, daemon=True).start()
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 512))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(128, 512)
    rows = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.monotonic_ns()
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        rows.append((t0, time.monotonic_ns() - t0))
    json.dump(rows, open(out, "w"))
""")


def run(cmd: list[str], env: dict[str, str]) -> float:
    start = time.monotonic()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.monotonic() - start


def sampled_span(run_dir: Path) -> tuple[int, int, dict] | None:
    for meta in run_dir.glob("rank-*/main-*/stacks.json"):
        m = json.loads(meta.read_text())
        return int(m["start_ns"]), int(m["end_ns"]), m
    return None


def ratio(rows: list[list[int]], span: tuple[int, int] | None, warmup: int = 20) -> float:
    if span is None:
        return float("nan")
    inside = [d for t, d in rows[warmup:] if span[0] <= t <= span[1]]
    outside = [d for t, d in rows[warmup:] if t > span[1] + 1e9 or t + 1e9 < span[0]]
    if not inside or not outside:
        return float("nan")
    return statistics.median(inside) / statistics.median(outside)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", default="32:0,1:64", help="torch:idle thread pairs")
    ap.add_argument("--seconds", type=float, default=40.0, help="each run's training loop")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of every job, interleaved")
    ap.add_argument("--json", type=Path, help="also write every run's row to this file")
    args = ap.parse_args()
    doctor = [sys.executable, "-m", "doctor.cli", "run"]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.py"
        job.write_text(JOB)
        for pair in args.jobs.split(",") * args.repeat:
            t, i = pair.split(":")
            out = str(Path(tmp) / "steps.json")
            base = [sys.executable, str(job), t, i, str(args.seconds), out]
            bare = run(base, dict(os.environ))
            bare_steps = len(json.loads(Path(out).read_text()))
            for label, extra in (("blocking (old)", {"DOCTOR_STACKS": "blocking"}),
                                 ("plan", {})):
                run_dir = Path(tmp) / f"run-{t}-{i}-{len(results)}"
                env = {k: v for k, v in os.environ.items() if k != "DOCTOR_STACKS"}
                env.update(extra)
                wall = run([*doctor, "--out", str(run_dir), "--", *base], env)
                rows = json.loads(Path(out).read_text())
                span = sampled_span(run_dir)
                plan = span[2] if span else {}
                results.append({
                    "torch_threads": int(t), "idle_threads": int(i), "mode": label,
                    "sampled_step_ratio": ratio(rows, span[:2] if span else None),
                    "throughput_vs_bare": len(rows) / bare_steps, "steps": len(rows),
                    "bare_steps": bare_steps, "extra_wall_s": wall - bare,
                    "recorder": plan.get("recorder"), "rate_hz": plan.get("rate_hz"),
                    "busy_threads": plan.get("busy_threads"), "threads": plan.get("threads"),
                    "taken": plan.get("taken")})
    print(f"{'torch':>5} {'idle':>4} {'mode':>15} {'sampled steps':>13} {'steps/bare':>10} "
          f"{'extra s':>7} {'plan':>22} busy/all")
    for r in results:
        plan = f"{r['recorder']} {r['rate_hz']} Hz"
        print(f"{r['torch_threads']:5d} {r['idle_threads']:4d} {r['mode']:>15} "
              f"{r['sampled_step_ratio']:13.3f} {r['throughput_vs_bare']:10.3f} "
              f"{r['extra_wall_s']:7.1f} {plan:>22} {r['busy_threads']}/{r['threads']}")
    if args.repeat > 1:
        print("medians over the rounds:")
        groups: dict[tuple, list[dict]] = {}
        for r in results:
            groups.setdefault((r["torch_threads"], r["idle_threads"], r["mode"]), []).append(r)
        for (t, i, mode), rs in groups.items():
            print(f"{t:5d} {i:4d} {mode:>15} "
                  f"{statistics.median(r['sampled_step_ratio'] for r in rs):13.3f} "
                  f"{statistics.median(r['throughput_vs_bare'] for r in rs):10.3f} "
                  f"{statistics.median(r['extra_wall_s'] for r in rs):7.1f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
