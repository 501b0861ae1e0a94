"""Accuracy of doctor's verdicts and speedup estimates on the sample jobs, measured by ablation.

Each sample job has one known bottleneck and a switch that removes it. For every job and every
``--workers`` setting, the job runs (a) under ``doctor run`` (its ``verdict.json`` is read) and
(b) bare with ``--ablate BLOCK``: in that one process the switch goes off and on every BLOCK steps
and the job reports the median step of each side, so both sides see the same machine (this kind
of machine can change speed from one process to the next by more than a switch does). The true
share of the bottleneck is ``1 - median step with switch / median step without``, and the
measured speedup is the median step without over the one with, both from the job's own clock (its
last stdout line). With ``--repeat N`` both run N times, alternated, and the table takes the
medians (steps, shares, estimates) and the most common verdict (with its count when the runs
disagree). The load average is printed at the start and the end: other work on the machine moves
the bare timings.

The table gives, per setting: the verdict, doctor's shares of io / decode / preprocess /
compute, the estimated speedup of the top finding in the expected category (``exp``; or of the
top finding, ``top``, when none is in that category), the measured speedup, and whether the
estimate is within ±25 % of it, and ``train w/o``: the training part of the step (forward,
backward, optimizer, timed by the input jobs) with the switch over without it, in the same
ablation runs. Below 1, removing the stage also made the rest of the step faster (caches that stay
warm, for one), which doctor, seeing the slow side only, cannot estimate. Then the count of
correct verdicts and of estimates within ±25 %. The JSON keeps each run's estimate and
measured speedup (``estimates``, ``measured_each``).

The expected category is the bench's knowledge of each job; doctor never sees it.

    python bench/accuracy.py
    python bench/accuracy.py --jobs io_bound decode_bound --workers 0 --steps 30 --json rows.json

With the jobs' own lengths (40-120 steps) every analysed step falls inside the 8 s of stack
sampling, whose pauses slow the doctor run; ``--steps 300`` leaves enough steps outside it for the
shares of the slower jobs to come from them (the bench then takes about 13 minutes here;
``--steps 300 --repeat 5``, the figures of the closing note of issue 3, about 60).
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
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_JOBS = ROOT / "sample_jobs"
TOLERANCE = 0.25
SHOWN = ("io", "decode", "preprocess", "compute")


@dataclass(frozen=True)
class Job:
    expected: str          # the category the job's bottleneck belongs to
    switch: str            # the flag that removes the bottleneck
    has_workers: bool = True  # whether the job takes --workers


JOBS: dict[str, Job] = {
    "io_bound": Job("io", "--cached"),
    "decode_bound": Job("decode", "--predecoded"),
    "preprocess_bound": Job("preprocess", "--pretransformed"),
    "collate_bound": Job("preprocess", "--fast-collate"),
    "input_bound": Job("preprocess", "--cached"),
    "get_batch_bound": Job("preprocess", "--prebatched", has_workers=False),
    "compute_bound": Job("compute", "--small-model", has_workers=False),
}


@dataclass
class Row:
    job: str
    workers: int | None
    expected: str
    verdict: str = "error"   # the most common of the doctor runs' verdicts
    verdicts: list[str] = field(default_factory=list)  # each doctor run's
    shares: dict[str, float] = field(default_factory=dict)
    estimate: float | None = None
    estimate_from: str = ""      # "exp": top finding of the expected category; "top": top finding
    estimate_finding: str = ""
    bare_step_s: float | None = None
    switched_step_s: float | None = None
    # the training part of the step (forward, backward, optimizer) on each side, where the job
    # times it: below 1 with/without, removing the stage also sped up the rest of the step
    bare_train_s: float | None = None
    switched_train_s: float | None = None
    estimates: list[float] = field(default_factory=list)   # each doctor run's
    measured_each: list[float] = field(default_factory=list)  # each ablation's
    doctor_step_s: float | None = None
    error: str = ""

    @property
    def measured(self) -> float | None:
        if self.bare_step_s and self.switched_step_s:
            return self.bare_step_s / self.switched_step_s
        return None

    @property
    def train_ratio(self) -> float | None:
        if self.bare_train_s and self.switched_train_s:
            return self.switched_train_s / self.bare_train_s
        return None

    @property
    def true_share(self) -> float | None:
        if self.bare_step_s and self.switched_step_s:
            return 1.0 - self.switched_step_s / self.bare_step_s
        return None

    @property
    def correct(self) -> bool:
        return self.verdict == self.expected

    @property
    def within(self) -> bool | None:
        if self.estimate is None or self.measured is None:
            return None
        return abs(self.estimate / self.measured - 1.0) <= TOLERANCE

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "measured_speedup": self.measured, "true_share": self.true_share,
                "train_ratio": self.train_ratio, "correct": self.correct,
                "within_tolerance": self.within}


def job_command(name: str, workers: int | None, steps: int | None, *extra: str) -> list[str]:
    cmd = [sys.executable, str(SAMPLE_JOBS / f"{name}.py")]
    if workers is not None:
        cmd += ["--workers", str(workers)]
    if steps is not None:
        cmd += ["--steps", str(steps)]
    return cmd + list(extra)


def last_json_line(stdout: str) -> dict[str, Any]:
    lines = [line for line in stdout.strip().splitlines() if line.strip()]
    if not lines:
        raise RuntimeError("the job printed nothing")
    return dict(json.loads(lines[-1]))


def run_ablation(cmd: list[str], timeout: float) -> tuple[float, float, float | None, float | None]:
    """The job's own median steady step without its switch and with it, in seconds, from one
    process that alternates the two (``--ablate``), then the same for the training part of the
    step where the job times it (None where not)."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[1:])} exited {proc.returncode}: "
                           f"{proc.stderr.strip()[-400:]}")
    line = last_json_line(proc.stdout)
    trains = [line.get(k) for k in ("train_median_s", "switched_train_median_s")]
    off_train, on_train = (float(t) if t is not None else None for t in trains)
    return float(line["median_step_s"]), float(line["switched_median_step_s"]), off_train, on_train


def run_doctor(cmd: list[str], timeout: float) -> tuple[dict[str, Any], float | None]:
    """The verdict of ``doctor run`` on the job, and the job's own median step under it."""
    with tempfile.TemporaryDirectory(prefix="doctor-accuracy-") as tmp:
        out = Path(tmp) / "run"
        proc = subprocess.run([sys.executable, "-m", "doctor.cli", "run", "--out", str(out),
                               "--", *cmd], capture_output=True, text=True, timeout=timeout)
        verdict_path = out / "verdict.json"
        if not verdict_path.is_file():
            raise RuntimeError(f"doctor run exited {proc.returncode} without verdict.json: "
                               f"{proc.stderr.strip()[-400:]}")
        verdict = dict(json.loads(verdict_path.read_text()))
    try:
        step: float | None = float(last_json_line(proc.stdout)["median_step_s"])
    except (RuntimeError, ValueError, KeyError, TypeError):
        step = None
    return verdict, step


def pick_estimate(verdict: dict[str, Any], expected: str) -> tuple[float | None, str, str]:
    findings = [f for f in verdict.get("findings", [])
                if f.get("estimated_speedup") is not None]
    for f in findings:
        if f.get("category") == expected:
            return float(f["estimated_speedup"]), "exp", str(f.get("id", ""))
    if findings:
        return float(findings[0]["estimated_speedup"]), "top", str(findings[0].get("id", ""))
    return None, "", ""


def measure(name: str, workers: int | None, steps: int | None, timeout: float,
            repeat: int, block: int) -> Row:
    job = JOBS[name]
    row = Row(job=name, workers=workers, expected=job.expected)
    cmd = job_command(name, workers, steps)
    ablation = job_command(name, workers, steps, "--ablate", str(block))
    bare, with_switch, verdicts, doctor_steps = [], [], [], []
    trains: dict[bool, list[float]] = {False: [], True: []}
    try:
        for _ in range(repeat):  # alternate, so that a change of load hits both
            off, on, off_train, on_train = run_ablation(ablation, timeout)
            bare.append(off)
            with_switch.append(on)
            if off_train is not None and on_train is not None:
                trains[False].append(off_train)
                trains[True].append(on_train)
            verdict, step = run_doctor(cmd, timeout)
            verdicts.append(verdict)
            doctor_steps += [step] if step is not None else []
    except (RuntimeError, subprocess.TimeoutExpired, ValueError, KeyError) as exc:
        row.error = str(exc)
        return row
    row.bare_step_s = statistics.median(bare)
    row.switched_step_s = statistics.median(with_switch)
    row.measured_each = [off / on for off, on in zip(bare, with_switch, strict=True)]
    if trains[False]:
        row.bare_train_s = statistics.median(trains[False])
        row.switched_train_s = statistics.median(trains[True])
    row.doctor_step_s = statistics.median(doctor_steps) if doctor_steps else None
    row.verdicts = [str(v.get("bottleneck", "?")) for v in verdicts]
    row.verdict = Counter(row.verdicts).most_common(1)[0][0]
    keys = {k for v in verdicts for k in v.get("shares", {})}
    row.shares = {k: statistics.median(float(v.get("shares", {}).get(k, 0.0)) for v in verdicts)
                  for k in keys}
    picked = [pick_estimate(v, job.expected) for v in verdicts]
    estimates = [p for p in picked if p[0] is not None]
    if estimates:
        row.estimates = [e for e, _f, _i in estimates if e is not None]
        row.estimate = statistics.median(row.estimates)
        _est, row.estimate_from, row.estimate_finding = estimates[0]
    return row


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}"


def speed(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def table(rows: list[Row]) -> str:
    head = ["job", "workers", "expected", "verdict", *(f"{s[:4]}%" for s in SHOWN),
            "estimate (from)", "measured", "true share%", "±25%?", "train w/o"]
    body = []
    for r in rows:
        est = "-" if r.estimate is None else f"{speed(r.estimate)} ({r.estimate_from})"
        within = {True: "yes", False: "no", None: "-"}[r.within]
        body.append([r.job, "-" if r.workers is None else str(r.workers), r.expected,
                     r.verdict + ("" if r.correct else " ✗") + (
                         f" {r.verdicts.count(r.verdict)}/{len(r.verdicts)}"
                         if len(set(r.verdicts)) > 1 else ""),
                     *(pct(r.shares.get(s)) for s in SHOWN), est, speed(r.measured),
                     pct(r.true_share), within,
                     "-" if r.train_ratio is None else f"{r.train_ratio:.2f}"])
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    lines = [head, ["-" * w for w in widths], *body]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
                     for line in lines)


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cores"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", nargs="+", choices=sorted(JOBS), default=list(JOBS),
                    help="sample jobs to run (default: all)")
    ap.add_argument("--workers", nargs="+", type=int, default=[0, 1, 2],
                    help="DataLoader num_workers settings (default: 0 1 2)")
    ap.add_argument("--steps", type=int, default=None,
                    help="--steps for every job (default: each job's own)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="ablation and doctor runs per setting, alternated: the medians of the "
                         "steps, shares and estimates, and the most common verdict")
    ap.add_argument("--block", type=int, default=20,
                    help="steps between flips of the switch in the ablation runs (default 20)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per run")
    ap.add_argument("--json", type=Path, help="also write the rows to this file")
    args = ap.parse_args()

    t0 = time.perf_counter()
    loads = [os.getloadavg()[0]]
    print(f"start: {load()}", file=sys.stderr, flush=True)
    rows: list[Row] = []
    for name in args.jobs:
        settings: list[int | None] = (list(args.workers) if JOBS[name].has_workers else [None])
        for workers in settings:
            row = measure(name, workers, args.steps, args.timeout, max(1, args.repeat),
                          max(1, args.block))
            loads.append(os.getloadavg()[0])
            rows.append(row)
            note = f"error: {row.error}" if row.error else (
                f"verdict {row.verdict}, estimate {speed(row.estimate)}, "
                f"measured {speed(row.measured)}")
            print(f"  {name} workers={'-' if workers is None else workers}: {note}",
                  file=sys.stderr, flush=True)

    print(table(rows))
    correct = sum(r.correct for r in rows)
    rated = [r for r in rows if r.within is not None]  # an estimate and a measured speedup
    within = sum(bool(r.within) for r in rated)
    runs = [(v, r.expected) for r in rows for v in r.verdicts]
    print(f"\ncorrect verdicts: {correct}/{len(rows)} "
          f"(each run: {sum(v == e for v, e in runs)}/{len(runs)}); "
          f"estimates within ±{100 * TOLERANCE:.0f} % of measured: {within}/{len(rated)}")
    print("estimate (from): exp = top finding in the expected category; top = top finding "
          "(none in the expected category). measured = median step / with the switch, both "
          "sides in one process (--ablate); train w/o = the training part of the step with "
          "the switch / without: "
          + ", ".join(f"{name} {JOBS[name].switch}" for name in args.jobs) + ".")
    print(f"end: {load()}; median 1-min load during the bench "
          f"{statistics.median(loads):.2f}; {time.perf_counter() - t0:.0f} s")
    if args.json:
        args.json.write_text(json.dumps([r.as_dict() for r in rows], indent=2) + "\n")


if __name__ == "__main__":
    main()
