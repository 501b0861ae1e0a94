"""Accuracy of doctor's verdicts and speedup estimates on the sample jobs, measured by ablation.

Each sample job has one known bottleneck and a switch that removes it. For every job and every
``--workers`` setting, one process runs the job under ``doctor run`` for ``--steps`` steps
without its switch and then ``--switched-steps`` more with it (the jobs' ``--switch-after``).
doctor's verdict and estimates are those of ``doctor report --steps :LAST``, the analysis of the
steps before the switch only; the measured speedup is the median step of those same analysed
steps over the median step after the switch (its first 10 left out: a fresh DataLoader starts
its workers there), both from doctor's step ledger, so the estimate and the truth come from the
same process: this kind of machine changes speed from one process to the next by more than the
band (the same job, bare, 1.2-1.8x between runs), and not evenly between the Python loading and
the training part. ``--separate-ablation`` also measures the speedup the old way, in a bare
process that flips the switch every ``--block`` steps (``--ablate``), for a second column
(``sep.``). With ``--repeat N`` each setting runs N times and the table takes the medians
(steps, shares, estimates) and the most common verdict (with its count when the runs disagree).
The load average is printed at the start and the end.

The table gives, per setting: the verdict, doctor's shares of io / decode / preprocess /
compute, the estimated speedup of the top finding in the expected category (``exp``; or of the
top finding, ``top``, when none is in that category), the measured speedup, and whether the
estimate is within ±25 % of it, and ``b+o w/o``: the backward pass and optimizer step (doctor's
hooks, in the ledger) after the switch over before it, in the same runs. Below 1, removing the
stage also made the rest of the step faster (caches that stay warm, for one), which doctor,
seeing the slow side only, cannot estimate. Then the count of correct verdicts and of estimates
within ±25 %. The JSON keeps each run's estimate and measured speedup (``estimates``,
``measured_each``).

io_bound's switch serves its reads from the page cache (``--cache page``): the job still reads
every file, so only the storage wait goes, the time the io share measures and what doctor's io
fix (a local or in-memory copy of the files) gives. ``--io-cache memory`` makes the switch keep
the sample arrays in memory instead, which also saves each read's copy into a fresh buffer and
its pass through the CPU caches (the rest of the step speeds up too): a bigger change than the
io share, whose estimate reads 10-30 % under that speedup here.

The expected category is the bench's knowledge of each job; doctor never sees it. compute_bound
swaps its model (and optimizer) at the switch, so doctor's ledger, which counts the steps of the
optimizer that steps most, has no steps after it: its measured speedup is the job's own clock.

    python bench/accuracy.py
    python bench/accuracy.py --jobs io_bound decode_bound --workers 0 --steps 300 --json rows.json

``--steps`` (500 by default) leaves enough steps before the switch outside the 8 s of stack
sampling (whose steps count in the shares, less the pauses measured in them) for the sampler's
pause to be measured against them; the bench then takes about 11 minutes a repeat here, and
``--repeat 5`` (the figures of the closing note of issue 3) 56.
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

import pandas as pd

from doctor.pipeline import analyze_run
from doctor.reports.json import verdict_data

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_JOBS = ROOT / "sample_jobs"
TOLERANCE = 0.25
SKIP_AFTER_SWITCH = 10  # steps after the switch left out of its median (fresh loader, workers)
MIN_SWITCHED_STEPS = 10
SHOWN = ("io", "decode", "preprocess", "compute")


@dataclass(frozen=True)
class Job:
    expected: str          # the category the job's bottleneck belongs to
    switch: str            # the flag that removes the bottleneck
    has_workers: bool = True  # whether the job takes --workers
    #: the findings (id prefixes) whose estimate the switch measures; None: any finding of the
    #: expected category. compute_bound's switch shrinks the model 16x, which is no fix doctor
    #: suggests: the ops findings' estimates (autocast, fusion) are of other changes.
    measures: tuple[str, ...] | None = None


JOBS: dict[str, Job] = {
    "io_bound": Job("io", "--cached"),
    "decode_bound": Job("decode", "--predecoded"),
    "preprocess_bound": Job("preprocess", "--pretransformed"),
    "pil_transforms": Job("preprocess", "--pretransformed"),
    "collate_bound": Job("preprocess", "--fast-collate"),
    "input_bound": Job("preprocess", "--cached"),
    "get_batch_bound": Job("preprocess", "--prebatched", has_workers=False),
    "compute_bound": Job("compute", "--small-model", has_workers=False,
                         measures=("compute.",)),
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
    # median analysed step before the switch and median step after it (ledger; else job clock)
    bare_step_s: float | None = None
    switched_step_s: float | None = None
    measured_from: str = ""      # "ledger", or "job" (the job's own clock)
    # backward + optimizer (doctor's hooks) on each side: below 1 with/without, removing the
    # stage also sped up the rest of the step
    bare_train_s: float | None = None
    switched_train_s: float | None = None
    estimates: list[float] = field(default_factory=list)   # each doctor run's
    measured_each: list[float] = field(default_factory=list)  # each doctor run's
    separate_each: list[float] = field(default_factory=list)  # each separate ablation's
    doctor_step_s: float | None = None
    error: str = ""

    @property
    def measured(self) -> float | None:
        if self.bare_step_s and self.switched_step_s:
            return self.bare_step_s / self.switched_step_s
        return None

    @property
    def separate(self) -> float | None:
        return statistics.median(self.separate_each) if self.separate_each else None

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
                "separate_speedup": self.separate, "train_ratio": self.train_ratio,
                "correct": self.correct, "within_tolerance": self.within}


@dataclass
class SameRun:
    """One doctor run with the switch after ``steps``: the analysis of the steps before it, and
    the step medians of both sides."""
    verdict: dict[str, Any]
    before_s: float | None
    after_s: float | None
    measured_from: str
    train_before_s: float | None
    train_after_s: float | None
    job_step_s: float | None


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


def _seconds(line: dict[str, Any], key: str) -> float | None:
    value = line.get(key)
    return float(value) if value is not None else None


def run_ablation(cmd: list[str], timeout: float) -> tuple[float, float]:
    """The job's own median steady step without its switch and with it, in seconds, from one
    bare process that alternates the two (``--ablate``)."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[1:])} exited {proc.returncode}: "
                           f"{proc.stderr.strip()[-400:]}")
    line = last_json_line(proc.stdout)
    return float(line["median_step_s"]), float(line["switched_median_step_s"])


def ledger_sides(ledger: pd.DataFrame, switch_step: int, column: str = "wall_s"
                 ) -> tuple[float | None, float | None]:
    """Medians of ``column`` over the analysed steps (those before the switch) and over the
    steps after the switch less the first SKIP_AFTER_SWITCH. Ledger step k ends at the k+1-th
    optimizer step, so the job's first switched step is ledger step ``switch_step``."""
    before = ledger.loc[ledger["analyzed"], column]
    after = ledger.loc[ledger["step"] >= switch_step + SKIP_AFTER_SWITCH, column]
    return (float(before.median()) if len(before) else None,
            float(after.median()) if len(after) >= MIN_SWITCHED_STEPS else None)


def run_doctor(cmd: list[str], switch_step: int, timeout: float) -> SameRun:
    """``doctor run`` on the job (whose switch turns on at ``switch_step``), analysed up to it."""
    with tempfile.TemporaryDirectory(prefix="doctor-accuracy-") as tmp:
        out = Path(tmp) / "run"
        proc = subprocess.run([sys.executable, "-m", "doctor.cli", "run", "--out", str(out),
                               "--", *cmd], capture_output=True, text=True, timeout=timeout)
        if not (out / "verdict.json").is_file():
            raise RuntimeError(f"doctor run exited {proc.returncode} without verdict.json: "
                               f"{proc.stderr.strip()[-400:]}")
        analysis = analyze_run(out, (None, switch_step - 1))
    line = last_json_line(proc.stdout)
    ledger = analysis.ledger.assign(
        training_s=analysis.ledger["backward_s"] + analysis.ledger["optimizer_s"])
    before, after = ledger_sides(ledger, switch_step)
    train_before, train_after = ledger_sides(ledger, switch_step, "training_s")
    source = "ledger"
    if before is None or after is None:  # no steps after the switch in the ledger
        before, after = _seconds(line, "median_step_s"), _seconds(line, "switched_median_step_s")
        source = "job"
    return SameRun(verdict_data(analysis), before, after, source, train_before or None,
                   train_after or None, _seconds(line, "median_step_s"))


def pick_estimate(verdict: dict[str, Any], expected: str,
                  measures: tuple[str, ...] | None = None) -> tuple[float | None, str, str]:
    findings = [f for f in verdict.get("findings", [])
                if f.get("estimated_speedup") is not None
                and (measures is None or str(f.get("id", "")).startswith(measures))]
    for f in findings:
        if f.get("category") == expected:
            return float(f["estimated_speedup"]), "exp", str(f.get("id", ""))
    if findings:
        return float(findings[0]["estimated_speedup"]), "top", str(findings[0].get("id", ""))
    return None, "", ""


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def measure(name: str, workers: int | None, steps: int, switched_steps: int, timeout: float,
            repeat: int, block: int | None, extra: tuple[str, ...] = ()) -> Row:
    """``repeat`` doctor runs of the job (with ``extra`` arguments) with its switch after
    ``steps``, and as many separate ablations (``--ablate block``) when ``block`` is given,
    alternated."""
    job = JOBS[name]
    row = Row(job=name, workers=workers, expected=job.expected)
    cmd = job_command(name, workers, steps + switched_steps, *extra, "--switch-after", str(steps))
    runs: list[SameRun] = []
    try:
        for _ in range(repeat):
            if block is not None:
                off, on = run_ablation(job_command(name, workers, steps, *extra, "--ablate",
                                                   str(block)), timeout)
                row.separate_each.append(off / on)
            runs.append(run_doctor(cmd, steps, timeout))
    except (RuntimeError, subprocess.TimeoutExpired, ValueError, KeyError) as exc:
        row.error = str(exc)
        return row
    row.bare_step_s = _median([r.before_s for r in runs])
    row.switched_step_s = _median([r.after_s for r in runs])
    row.measured_from = "/".join(sorted({r.measured_from for r in runs}))
    row.measured_each = [r.before_s / r.after_s for r in runs if r.before_s and r.after_s]
    row.bare_train_s = _median([r.train_before_s for r in runs])
    row.switched_train_s = _median([r.train_after_s for r in runs])
    row.doctor_step_s = _median([r.job_step_s for r in runs])
    verdicts = [r.verdict for r in runs]
    row.verdicts = [str(v.get("bottleneck", "?")) for v in verdicts]
    row.verdict = Counter(row.verdicts).most_common(1)[0][0]
    keys = {k for v in verdicts for k in v.get("shares", {})}
    row.shares = {k: statistics.median(float(v.get("shares", {}).get(k, 0.0)) for v in verdicts)
                  for k in keys}
    picked = [pick_estimate(v, job.expected, job.measures) for v in verdicts]
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
            "estimate (from)", "measured", "true share%", "±25%?", "b+o w/o"]
    separate = any(r.separate_each for r in rows)
    if separate:
        head.append("sep.")
    body = []
    for r in rows:
        est = "-" if r.estimate is None else f"{speed(r.estimate)} ({r.estimate_from})"
        within = {True: "yes", False: "no", None: "-"}[r.within]
        body.append([r.job, "-" if r.workers is None else str(r.workers), r.expected,
                     r.verdict + ("" if r.correct else " ✗") + (
                         f" {r.verdicts.count(r.verdict)}/{len(r.verdicts)}"
                         if len(set(r.verdicts)) > 1 else ""),
                     *(pct(r.shares.get(s)) for s in SHOWN), est,
                     speed(r.measured) + (" (job)" if r.measured_from == "job" else ""),
                     pct(r.true_share), within,
                     "-" if r.train_ratio is None else f"{r.train_ratio:.2f}",
                     *([speed(r.separate)] if separate else [])])
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
    ap.add_argument("--steps", type=int, default=500,
                    help="steps before the switch, the ones doctor analyses (default 500)")
    ap.add_argument("--switched-steps", type=int, default=150,
                    help="steps after the switch, measured only (default 150)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="doctor runs per setting: the medians of the steps, shares and "
                         "estimates, and the most common verdict")
    ap.add_argument("--separate-ablation", action="store_true",
                    help="also measure the speedup in separate bare processes that flip the "
                         "switch every --block steps (--steps in all), alternated with the "
                         "doctor runs (column sep.; about twice the time)")
    ap.add_argument("--block", type=int, default=20,
                    help="steps between flips of the switch in the separate ablation "
                         "(default 20)")
    ap.add_argument("--io-cache", choices=("page", "memory"), default="page",
                    help="what io_bound's switch caches: the files' pages, so that only the "
                         "storage wait goes (default), or the sample arrays in memory, which "
                         "also saves the reads' copies")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per run")
    ap.add_argument("--json", type=Path, help="also write the rows to this file")
    args = ap.parse_args()

    t0 = time.perf_counter()
    loads = [os.getloadavg()[0]]
    print(f"start: {load()}", file=sys.stderr, flush=True)
    # io_bound's switch caches what --io-cache says
    extras = {name: ("--cache", args.io_cache) if name == "io_bound" else () for name in args.jobs}
    rows: list[Row] = []
    for name in args.jobs:
        settings: list[int | None] = (list(args.workers) if JOBS[name].has_workers else [None])
        for workers in settings:
            row = measure(name, workers, args.steps, args.switched_steps, args.timeout,
                          max(1, args.repeat),
                          max(1, args.block) if args.separate_ablation else None, extras[name])
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
          "(none in the expected category). measured = median analysed step before the switch "
          "/ median step after it, in the same doctor run (its ledger; (job): the job's own "
          "clock); b+o w/o = backward + optimizer step after the switch / before it"
          + ("; sep. = measured in separate bare processes (--ablate)" if args.separate_ablation
             else "") + ": "
          + ", ".join(" ".join((name, JOBS[name].switch, *extras[name])) for name in args.jobs)
          + ".")
    print(f"end: {load()}; median 1-min load during the bench "
          f"{statistics.median(loads):.2f}; {time.perf_counter() - t0:.0f} s")
    if args.json:
        args.json.write_text(json.dumps([r.as_dict() for r in rows], indent=2) + "\n")


if __name__ == "__main__":
    main()
