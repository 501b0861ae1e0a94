"""How close doctor's speedup estimates come to what ``doctor try`` measures, on the sample jobs.

For each sample job (at the setting that gives it its bottleneck), ``doctor run`` records it and
``doctor try --repeat R`` tries every fix that needs no code, alone and then together. The
table gives, per fix: the estimate (the fix's own, from the run's verdict), the measured
speedup (baseline median step over the fix's, the steps of all rounds pooled) with the lowest
and highest round, their ratio (measured over estimated; the goal is 0.75-1.33) and the outcome.
Below it, per job, the cost of the try: the time of every step the attempts ran (warm-up
included) over the job's own ``--steps`` steps (the budget: about 3x per fix tried, start-ups
apart), per fix, and the whole wall time, of which the start-ups and the exits of the attempts.

    python bench/try_accuracy.py                    # every job, --repeat 3
    python bench/try_accuracy.py --jobs input_bound --repeat 2 --json rows.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_JOBS = ROOT / "sample_jobs"
BAND = (0.75, 1.33)

#: job -> its arguments for the run that the fixes are tried on
JOBS: dict[str, list[str]] = {
    "input_bound": ["--steps", "60"],
    "io_bound": ["--steps", "60"],
    "http_loader": ["--steps", "100"],
    "decode_bound": ["--steps", "60"],
    "preprocess_bound": ["--steps", "60"],
    "collate_bound": ["--steps", "60"],
    "compute_bound": ["--steps", "60", "--threads", "1"],
    "ddp_allreduce_bound": ["--steps", "40"],
}
#: jobs that run under torchrun, with its arguments
TORCHRUN = {"ddp_allreduce_bound": ["--nproc-per-node", "2"]}


def doctor(*args: str, cwd: Path, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "doctor.cli", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=timeout)


def bench_job(job: str, args: list[str], repeat: int, steps: int, work: Path
              ) -> dict[str, Any]:
    run_dir = work / job
    launcher = ["torchrun", *TORCHRUN[job]] if job in TORCHRUN else [sys.executable]
    ran = doctor("run", "--out", str(run_dir), "--", *launcher,
                 str(SAMPLE_JOBS / f"{job}.py"), *args, cwd=work)
    if ran.returncode != 0:
        return {"job": job, "error": f"doctor run failed: {ran.stderr[-500:]}"}
    verdict = json.loads((run_dir / "verdict.json").read_text())
    tried = doctor("try", str(run_dir), "--yes", "--repeat", str(repeat), "--steps", str(steps),
                   cwd=work)
    if tried.returncode != 0:
        return {"job": job, "bottleneck": verdict["bottleneck"],
                "error": tried.stderr.strip().splitlines()[-1] if tried.stderr else "failed"}
    record = json.loads(sorted(run_dir.glob("tries/*/try.json"))[-1].read_text())
    return {"job": job, "bottleneck": verdict["bottleneck"], "record": record}


def _x(v: Any) -> str:
    return f"{v:.2f}x" if isinstance(v, int | float) else "-"


def print_table(results: list[dict[str, Any]]) -> None:
    head = f"{'job':<20}{'fix':<22}{'setting':<40}{'est.':>7}{'measured':>10}" \
           f"{'rounds':>13}{'ratio':>7}  outcome"
    print(head)
    print("-" * len(head))
    inside = total = 0
    for r in results:
        if "error" in r:
            print(f"{r['job']:<20}{r['error']}")
            continue
        for c in r["record"]["candidates"]:
            lo, hi = c.get("low"), c.get("high")
            rounds = f"{lo:.2f}-{hi:.2f}" if lo and hi else "-"
            ratio = c.get("ratio")
            if ratio:
                total += 1
                inside += BAND[0] <= ratio <= BAND[1]
            print(f"{r['job']:<20}{c['id']:<22}{c['label'][:39]:<40}{_x(c.get('estimate')):>7}"
                  f"{_x(c.get('speedup')):>10}{rounds:>13}"
                  f"{(f'{ratio:.2f}' if ratio else '-'):>7}  {c['outcome']}")
    print(f"\nratios within {BAND[0]}-{BAND[1]}: {inside} of {total} estimated fixes")
    print(f"\n{'job':<20}{'fixes':>6}{'attempts':>9}{'steps/job steps':>17}"
          f"{'per fix':>9}{'wall s':>8}{'start-ups s':>12}{'exits s':>9}  baseline rounds (ms)")
    for r in results:
        if "error" in r:
            continue
        cost = r["record"]["cost"]
        fixes = len(r["record"]["candidates"])
        ratio = cost.get("ratio_to_job_steps") or 0.0
        print(f"{r['job']:<20}{fixes:>6}{cost['attempts']:>9}{ratio:>17.2f}"
              f"{ratio / max(fixes, 1):>9.2f}{cost['wall_s']:>8.0f}{cost['startup_s']:>12.0f}"
              f"{cost.get('exit_s', 0.0):>9.0f}"
              f"  {baseline_rounds(r['record'])}"
              f"{'  unsure' if r['record'].get('unsteady') else ''}")


def baseline_rounds(record: dict[str, Any]) -> str:
    return " ".join(f"{x['median_step_s'] * 1e3:.0f}" for x in record["baseline"]["rounds"]
                    if x.get("median_step_s"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", nargs="*", default=list(JOBS), choices=list(JOBS))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    args = ap.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="doctor-try-bench-") as tmp:
        for job in args.jobs:
            t0 = time.monotonic()
            results.append(bench_job(job, JOBS[job], args.repeat, args.steps, Path(tmp)))
            print(f"  {job}: {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    print_table(results)
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
