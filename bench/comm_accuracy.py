"""Accuracy of doctor's verdicts and speedup estimates on the DDP sample jobs (gloo, two ranks
on this machine), measured by ablation.

Each job has one known cause and a switch that removes it. Per repeat and job:

1. ``doctor run -- torchrun --nproc-per-node 2 JOB``: the verdict, the communication share, and
   the estimate of the finding that names the cause (``comm.exposed``'s for the communication
   jobs, ``distributed.straggler``'s for the slow rank; 1.0 where it did not fire);
2. the job bare, and bare with its switch: the measured speedup is the job's own median step
   (its slowest rank's: without the all-reduce the ranks no longer wait for each other) without
   the switch over with it. The communication jobs' switch is ``--skip-allreduce``: DDP as it
   is, with a communication hook that reduces nothing, so only the collectives go. For
   reference, the ``no DDP`` column times the job without DDP at all (``--no-allreduce``),
   which also removes DDP's own work on the training thread (its hooks, zeroing gradients that
   are views of its buckets), work doctor counts as compute;
3. for ddp_latency_bound, also the fix: the speedup doctor's communication model predicts for
   its best bucket cap (the comm.exposed fix that sets ``bucket_cap_mb``) against the job bare
   with that cap.

With ``--repeat N`` (3 by default) the table takes the medians and the most common verdict. The
last column puts each speedup as the share of the step it removes (1 - 1/speedup), estimated and
measured: near the top, a few points of share are a large factor.

    python bench/comm_accuracy.py [--repeat 3] [--jobs ddp_latency_bound ...] [--json rows.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Job:
    expected: str  # the verdict's bottleneck
    finding: str  # the finding whose estimate is checked
    switch: tuple[str, ...]
    args: tuple[str, ...] = ()
    fix_flag: str | None = None  # the job's flag that sets what the fix's apply sets
    without_ddp: bool = True  # also time it without DDP (--no-allreduce), for reference


SKIP = ("--skip-allreduce",)  # DDP kept, its all-reduces skipped (sample_jobs/_ddp.py)
JOBS = {
    "ddp_allreduce_bound": Job("communication", "comm.exposed", SKIP, ("--steps", "60")),
    "ddp_latency_bound": Job("communication", "comm.exposed", SKIP, ("--steps", "60"),
                             fix_flag="--bucket-cap-mb"),
    "ddp_overlapped": Job("compute", "comm.exposed", SKIP, ("--steps", "30")),
    "ddp_slow_rank": Job("communication", "distributed.straggler", ("--balanced",),
                         ("--steps", "40"), without_ddp=False),
}


def torchrun(job: str, *args: str, under: Path | None = None) -> subprocess.CompletedProcess[str]:
    cmd = ["torchrun", "--nproc-per-node", "2", str(ROOT / "sample_jobs" / f"{job}.py"), *args]
    if under is not None:
        cmd = [sys.executable, "-m", "doctor.cli", "run", "--out", str(under), "--", *cmd]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return done


def median_step(out: str) -> float:
    """The job's median step: its slowest rank's, where it says (the DDP jobs), else rank 0's."""
    for line in reversed(out.splitlines()):
        if line.startswith("{") and "median_step_s" in line:
            timing = json.loads(line)
            return float(timing.get("slowest_median_step_s") or timing["median_step_s"])
    raise SystemExit("the job printed no timing line")


def one(name: str, job: Job, tmp: Path) -> dict[str, Any]:
    run_dir = tmp / f"{name}-doctor"
    torchrun(name, *job.args, under=run_dir)
    verdict = json.loads((run_dir / "verdict.json").read_text())
    found = {f["id"]: f for f in verdict["findings"]}
    finding = found.get(job.finding)
    bare = median_step(torchrun(name, *job.args).stdout)
    switched = median_step(torchrun(name, *job.args, *job.switch).stdout)
    row: dict[str, Any] = {
        "job": name, "verdict": verdict["bottleneck"],
        "communication": verdict["shares"].get("communication", 0.0),
        "estimate": (finding or {}).get("estimated_speedup") or 1.0,
        "measured": bare / switched, "bare_s": bare, "switched_s": switched,
    }
    if job.without_ddp:
        row["without_ddp"] = bare / median_step(torchrun(name, *job.args,
                                                         "--no-allreduce").stdout)
    fixes = [f for f in (finding or {}).get("fixes", []) if (f.get("apply") or {}).get("ddp")]
    if job.fix_flag and fixes and fixes[0].get("estimated_speedup"):
        cap = fixes[0]["apply"]["ddp"]["bucket_cap_mb"]
        fixed = median_step(torchrun(name, *job.args, job.fix_flag, str(cap)).stdout)
        row.update(fix=f"bucket_cap_mb={cap:g}", fix_estimate=fixes[0]["estimated_speedup"],
                   fix_measured=bare / fixed)
    return row


def within(estimate: float, measured: float, band: float = 0.25) -> bool:
    return abs(estimate - measured) <= band * measured


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for name in dict.fromkeys(r["job"] for r in rows):
        mine = [r for r in rows if r["job"] == name]
        verdicts = Counter(r["verdict"] for r in mine)
        verdict, n = verdicts.most_common(1)[0]
        row = {"job": name, "expected": JOBS[name].expected,
               "verdict": verdict if n == len(mine) else f"{verdict} ({n}/{len(mine)})",
               **{k: statistics.median(r[k] for r in mine)
                  for k in ("communication", "estimate", "measured")},
               **({"without_ddp": statistics.median(r["without_ddp"] for r in mine)}
                  if all("without_ddp" in r for r in mine) else {}),
               "estimates": [r["estimate"] for r in mine],
               "measured_each": [r["measured"] for r in mine]}
        fixed = [r for r in mine if "fix" in r]
        if fixed:
            row.update(fix=fixed[0]["fix"],
                       fix_estimate=statistics.median(r["fix_estimate"] for r in fixed),
                       fix_measured=statistics.median(r["fix_measured"] for r in fixed))
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", nargs="+", default=list(JOBS), choices=list(JOBS))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeat):
            for name in args.jobs:
                rows.append(one(name, JOBS[name], Path(tmp) / str(r)))
                print(f"  repeat {r + 1}: {name}: {rows[-1]['verdict']}, "
                      f"est {rows[-1]['estimate']:.2f}x, measured {rows[-1]['measured']:.2f}x",
                      flush=True)
    table = summarise(rows)
    print(f"\n{'job':22} {'expected':14} {'verdict':18} {'comm':>6} {'est':>6} {'meas':>6}  ±25%"
          f"  {'no DDP':>6}  share est/meas")
    for t in table:
        no_ddp = f"{t['without_ddp']:5.2f}x" if "without_ddp" in t else ""
        print(f"{t['job']:22} {t['expected']:14} {t['verdict']:18} {t['communication']:6.0%} "
              f"{t['estimate']:5.2f}x {t['measured']:5.2f}x  "
              f"{'yes' if within(t['estimate'], t['measured']) else 'no ':4} {no_ddp:>7}  "
              f"{1 - 1 / t['estimate']:.0%}/{1 - 1 / t['measured']:.0%}")
        if "fix" in t:
            print(f"  fix {t['fix']:35} {'':9} {t['fix_estimate']:5.2f}x {t['fix_measured']:5.2f}x"
                  f"  {'yes' if within(t['fix_estimate'], t['fix_measured']) else 'no'}")
    right = sum(t["verdict"] == t["expected"] for t in table)
    close = sum(within(t["estimate"], t["measured"]) for t in table)
    print(f"\nverdicts {right}/{len(table)}; estimates within ±25 %: {close}/{len(table)}")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "table": table}, indent=1))


if __name__ == "__main__":
    main()
