"""What ``doctor run`` costs a job: the sample jobs bare and under doctor, alternating.

    python bench/overhead.py                      # both jobs, 5 pairs each, default window
    python bench/overhead.py --jobs compute_bound --pairs 7 --steps 900
    python bench/overhead.py --window off         # the always-on part alone
    python bench/overhead.py --shapes both        # the window with input shapes vs without
    python bench/overhead.py --window off --probes-off memory,model_state,ddp
                                                  # what those probes cost: against a run with all

For each job, runs ``python sample_jobs/JOB.py --steps N`` bare and under
``doctor run --out TMP [--window W] -- python sample_jobs/JOB.py --steps N``, in pairs whose order
alternates (bare, doctor, doctor, bare, bare, doctor, ...: a drift of the machine's speed cancels)
after one discarded bare warm-up run (page cache, torch import).
Both are timed by the job's own clock: its last JSON line gives ``median_step_s`` (median over
the steps after the first 20 %, so the deep window near the start is outside it) and ``loop_s``
(the whole training loop, which includes the one-off deep window).

Figures per job, each the median over pairs with (min..max):

* median step, doctor / bare: the always-on cost. Budget at most 1.01x. With it, a bootstrap
  90 % interval of that median (the pairs resampled): on this 2-core machine one pair's ratio
  moves by +-10 %, so read the budget against the interval, and run 15 pairs or more.
* doctor run's own CPU while the job ran (run.json's ``sampler_cpu_s`` over ``duration_s``): the
  parent's sampling, as a share of one core; it competes with the job only where the job keeps
  every core busy.
* loop time, doctor / bare: always-on cost plus the deep window, once. No budget of its own; the
  window's share of a run of ten minutes is derived below.
* From the doctor run's own ledger (``doctor.pipeline.analyze_run``), against the median
  analysed step of the same run:
  - window steps: the ledger rows that end after the window's start event and before its stop
    event (the events ring, read into ``doctor.analyse.steps.RankSteps``); the ledger numbers
    steps from one step boundary to the next, so these are the steps under an active profiler. The
    median of them / median step: budget at most 1.25x. Their max is shown too: the first
    profiled steps carry the profiler's own start-up.
  - the closing step (``window_close``): the step that stops the profiler and exports the trace on
    the training thread. Budget about 5x one step.
  - window excess: the seconds the window steps and the closing step took beyond the median step,
    as a share of a ten-minute run (DESIGN.md: amortised over ten minutes or more, at most 1 %).
  - steps under stack sampling (the ledger's ``sampled`` rows: py-spy's span after the window):
    their median / median step. They count in the job's own median step when the span covers
    many of the steps it is taken over (a short run): read the always-on cost with
    ``--window off``.
* disk: the run directory's size after ``doctor run`` finished (report included).

``--shapes both`` runs each pair twice, the window recording input shapes (doctor's default: the
ops' FLOPs and bytes) and not (``DOCTOR_SHAPES=off``), one after the other, and prints the two
tables and, pair by pair, the ratios of their window steps and closing steps.

``--rewindow VALUE`` sets DOCTOR_REWINDOW in the doctor runs: ``off`` (no later window), or the
detector's constants shrunk (``gap=0,sustain_min=32,sustain_fraction=0``), so that a drifting
job (``--jobs drift``: sample_jobs/drift.py turns input-bound after ``--slow-after`` seconds)
opens later windows in a short run; their cost as the job measured it (meta.json's
``later_windows``) is printed beside the window figures. Two runs of this bench, one with ``off``,
give the later windows' share of the loop.

``--probes-off NAMES`` leaves the named probes off in the doctor runs (``DOCTOR_PROBES_OFF``, the
registry's bench knob, doctor.probes): two runs of this bench, with and without, give a probe's
share of the median-step ratio. The Session's hot path and each job-side probe's CPU time per step
(bench/step_hooks.py: a tiny loop in one process, each probe off in turn) close the output.

The machine has 2 cores and other work on it shows up in every figure: the load average is
printed at the start and the end; with other load running, read min..max before the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from doctor.probes import ENV_PROBES_OFF

ROOT = Path(__file__).resolve().parents[1]
JOBS = ROOT / "sample_jobs"

# Steps for a training loop of roughly 20-30 s on this machine (2 cores, CPU torch): the 8 s of
# stack sampling after the window is a one-off cost, and must stay a minority of the steps that
# the median step is taken over.
DEFAULT_STEPS = {"compute_bound": 1500, "input_bound": 600}

SHAPES_VARIANTS = {"on": ("on",), "off": ("off",), "both": ("on", "off")}
SHAPES_ENV: dict[str, dict[str, str] | None] = {"on": None, "off": {"DOCTOR_SHAPES": "off"}}
BUDGET_MEDIAN = 1.01
BUDGET_WINDOW_STEP = 1.25
BUDGET_CLOSING = 5.0
BUDGET_AMORTISED = 0.01
AMORTISE_OVER_S = 600.0


def doctor_command() -> list[str]:
    script = Path(sys.executable).with_name("doctor")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "doctor.cli"]


def job_result(stdout: str) -> dict:
    """The job's own JSON line: the last stdout line that is a JSON object with its timings."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and "median_step_s" in obj:
            return obj
    raise RuntimeError("no timing line in the job's stdout")


def run(cmd: list[str], env: dict[str, str] | None = None) -> dict:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False,
                          env={**os.environ, **env} if env else None)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
        raise RuntimeError(f"exit {proc.returncode}: {' '.join(cmd)}\n{tail}")
    return job_result(proc.stdout)


@dataclass
class WindowFigures:
    median_step_s: float = float("nan")  # median analysed step in doctor's ledger
    active: list[float] = field(default_factory=list)  # wall_s of steps under the profiler
    closing_s: float = float("nan")
    sampled: list[float] = field(default_factory=list)  # wall_s of steps under stack sampling
    later: list[float] = field(default_factory=list)  # the later windows' cost (s), in the job
    note: str = ""

    def excess_s(self) -> float:
        if not self.active or self.closing_s != self.closing_s:
            return float("nan")
        return sum(self.active) + self.closing_s - (len(self.active) + 1) * self.median_step_s


def window_figures(run_dir: Path) -> WindowFigures:
    """Window steps and the closing step, from the run directory's ledger and events ring."""
    from doctor.analyse.steps import training_processes
    from doctor.pipeline import analyze_run
    from doctor.store.reader import load_run

    out = WindowFigures()
    for meta in run_dir.glob("rank-0/main-*/meta.json"):
        out.later += [float(w.get("cost_s", "nan"))
                      for w in json.loads(meta.read_text()).get("later_windows", [])]
    ledger = analyze_run(run_dir).ledger
    ledger = ledger[ledger["rank"] == ledger["rank"].min()].reset_index(drop=True)
    analysed = ledger.loc[ledger["analyzed"], "wall_s"]
    if analysed.empty:
        out.note = "no analysed step"
        return out
    out.median_step_s = float(analysed.median())
    out.sampled = [float(w) for w in ledger.loc[ledger["sampled"] & ~ledger["warmup"], "wall_s"]]
    closing = ledger.loc[ledger["window_close"], "wall_s"]
    if closing.empty:
        out.note = "no window closed"
        return out
    out.closing_s = float(closing.max())
    ranks = training_processes(load_run(run_dir))
    steps = ranks[min(ranks)]
    if steps.window_ns is None or len(steps.starts_ns) != len(ledger):
        out.note = "window events unreadable"
        return out
    start, stop_begin, _stop_end = steps.window_ns
    # The start event follows the step boundary that opens the window, inside the same hook, so
    # the first profiled step is the one that ends after the start event.
    mask = (steps.ends_ns > start) & (steps.ends_ns <= stop_begin)
    out.active = [float(w) for w in ledger.loc[mask, "wall_s"]]
    return out


@dataclass
class Pair:
    bare: dict
    doctor: dict
    window: WindowFigures
    disk: int
    load: float  # 1-minute load average when the pair started
    parent_cpu_s: float = float("nan")  # run.json: doctor run's own CPU while the job ran
    duration_s: float = float("nan")  # run.json: how long the job ran


def job_command(job: str, steps: int, extra: list[str]) -> list[str]:
    return [sys.executable, str(JOBS / f"{job}.py"), "--steps", str(steps), *extra]


def run_pair(job_cmd: list[str], window: str | None, keep: Path | None, name: str,
             env: dict[str, str] | None = None, probes_off: str = "",
             doctor_first: bool = False) -> Pair:
    """One bare run and one under doctor; ``doctor_first`` swaps their order (pairs alternate
    bare-doctor, doctor-bare, so that a drift of the machine's speed cancels out)."""
    load = os.getloadavg()[0]
    bare = {} if doctor_first else run(job_cmd)
    if probes_off:
        env = {**(env or {}), ENV_PROBES_OFF: probes_off}
    tmp = Path(tempfile.mkdtemp(prefix="doctor-overhead-"))
    run_dir = tmp / "run"
    try:
        cmd = [*doctor_command(), "run", "--out", str(run_dir)]
        if window is not None:
            cmd += ["--window", window]
        doc = run([*cmd, "--", *job_cmd], env)
        if doctor_first:
            bare = run(job_cmd)
        from doctor.store.rundir import disk_usage_bytes

        record = json.loads((run_dir / "run.json").read_text())

        disk = disk_usage_bytes(run_dir)
        try:
            figures = window_figures(run_dir)
        except Exception as err:  # the timing pair is still worth printing
            figures = WindowFigures(note=f"ledger unreadable: {type(err).__name__}: {err}")
        if keep is not None:
            shutil.copytree(run_dir, keep / name, dirs_exist_ok=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Pair(bare, doc, figures, disk, load, float(record.get("sampler_cpu_s") or "nan"),
                float(record.get("duration_s") or "nan"))


def spread(values: list[float], fmt: str = "{:.3f}") -> str:
    vals = [v for v in values if v == v]
    if not vals:
        return "n/a"
    return (f"{fmt.format(statistics.median(vals))} "
            f"({fmt.format(min(vals))}..{fmt.format(max(vals))})")


def bootstrap_interval(values: list[float], level: float = 0.90, rounds: int = 5000
                       ) -> tuple[float, float]:
    """A bootstrap interval of the median of ``values`` (pairs resampled with replacement): how
    far the median ratio could move with other draws of the machine's noise."""
    vals = np.array([v for v in values if v == v])
    if len(vals) < 3:
        return float("nan"), float("nan")
    rng = np.random.default_rng(0)
    meds = np.median(rng.choice(vals, size=(rounds, len(vals)), replace=True), axis=1)
    tail = (1 - level) / 2 * 100
    return float(np.percentile(meds, tail)), float(np.percentile(meds, 100 - tail))


def verdict(value: float, budget: float) -> str:
    if value != value:
        return "n/a"
    return "PASS" if value <= budget else "OVER"


def med(values: list[float]) -> float:
    vals = [v for v in values if v == v]
    return statistics.median(vals) if vals else float("nan")


def report(title: str, pairs: list[Pair], window_on: bool) -> None:
    step_r = [p.doctor["median_step_s"] / p.bare["median_step_s"] for p in pairs]
    loop_r = [p.doctor["loop_s"] / p.bare["loop_s"] for p in pairs]
    print(f"\n== {title}: {len(pairs)} pairs, order alternating ==")
    print(f"{'pair':>4} {'bare step ms':>12} {'doc step ms':>11} {'ratio':>6} "
          f"{'bare loop s':>11} {'doc loop s':>10} {'ratio':>6} "
          f"{'win med':>7} {'win max':>7} {'close':>6} {'disk KB':>8} {'load':>5}")
    for i, p in enumerate(pairs, 1):
        w = p.window
        wmed = np.median(w.active) / w.median_step_s if w.active else float("nan")
        wmax = max(w.active) / w.median_step_s if w.active else float("nan")
        close = w.closing_s / w.median_step_s
        print(f"{i:>4} {p.bare['median_step_s'] * 1e3:>12.2f} "
              f"{p.doctor['median_step_s'] * 1e3:>11.2f} {step_r[i - 1]:>6.3f} "
              f"{p.bare['loop_s']:>11.2f} {p.doctor['loop_s']:>10.2f} {loop_r[i - 1]:>6.3f} "
              f"{wmed:>7.2f} {wmax:>7.2f} {close:>6.2f} {p.disk / 1024:>8.0f} {p.load:>5.2f}"
              + (f"  [{w.note}]" if w.note else ""))
    m = med(step_r)
    low, high = bootstrap_interval(step_r)
    print(f"  median step  doctor/bare  {spread(step_r)}   "
          f"budget <= {BUDGET_MEDIAN:.2f}x  {verdict(m, BUDGET_MEDIAN)}   "
          f"(90 % interval of the median: {low:.3f}..{high:.3f})")
    parent = [p.parent_cpu_s / p.duration_s for p in pairs]
    print(f"  doctor run's own CPU while the job ran, share of one core  "
          f"{spread([100 * x for x in parent], '{:.2f}')} %  (of {os.cpu_count()} cores)")
    print(f"  loop time    doctor/bare  {spread(loop_r)}   (includes the one-off window)")
    if not window_on:
        print("  window off: no window figures")
    else:
        wins = [float(np.median(p.window.active)) / p.window.median_step_s
                for p in pairs if p.window.active]
        wmaxs = [max(p.window.active) / p.window.median_step_s
                 for p in pairs if p.window.active]
        closes = [p.window.closing_s / p.window.median_step_s for p in pairs]
        excess = [p.window.excess_s() for p in pairs]
        n_active = sorted({len(p.window.active) for p in pairs})
        print(f"  window steps ({'/'.join(map(str, n_active))} a run) median/step "
              f"{spread(wins, '{:.2f}')}   budget <= {BUDGET_WINDOW_STEP:.2f}x  "
              f"{verdict(med(wins), BUDGET_WINDOW_STEP)}")
        print(f"  window steps max/step            {spread(wmaxs, '{:.2f}')}   "
              f"(first profiled steps: profiler start-up)")
        sampled = [float(np.median(p.window.sampled)) / p.window.median_step_s
                   for p in pairs if p.window.sampled]
        counts = sorted({len(p.window.sampled) for p in pairs})
        print(f"  steps under stack sampling median/step {spread(sampled, '{:.2f}')}   "
              f"({min(counts, default=0)}-{max(counts, default=0)} steps a run; part of the "
              f"window's cost)")
        print(f"  closing step / step              {spread(closes, '{:.2f}')}   "
              f"budget <= ~{BUDGET_CLOSING:.0f}x  {verdict(med(closes), BUDGET_CLOSING)}")
        share = [e / AMORTISE_OVER_S for e in excess]
        print(f"  window excess s                  {spread(excess, '{:.3f}')}   "
              f"= {med(share) * 100:.3f} % of a {AMORTISE_OVER_S / 60:.0f}-min run, "
              f"budget <= {BUDGET_AMORTISED * 100:.0f} %  "
              f"{verdict(med(share), BUDGET_AMORTISED)}")
    later = [sum(p.window.later) for p in pairs]
    if any(p.window.later for p in pairs):
        print(f"  later windows ({'/'.join(str(len(p.window.later)) for p in pairs)} a run), "
              f"their cost in the job s {spread(later, '{:.3f}')} = "
              f"{med(later) / AMORTISE_OVER_S * 100:.3f} % of a 10-min run")
    disks = [p.disk / 1024 for p in pairs]
    print(f"  run directory disk KB            {spread(disks, '{:.0f}')}")


def shapes_report(on: list[Pair], off: list[Pair]) -> None:
    """Pair by pair, the window with shapes against without: its steps and its closing step."""
    def win(p: Pair) -> float:
        return float(np.median(p.window.active)) if p.window.active else float("nan")

    steps = [win(a) / win(b) for a, b in zip(on, off, strict=True)]
    closes = [a.window.closing_s / b.window.closing_s for a, b in zip(on, off, strict=True)]
    extra = [(a.window.excess_s() - b.window.excess_s()) / AMORTISE_OVER_S
             for a, b in zip(on, off, strict=True)]
    print("\n== window shapes on / off, pair by pair ==")
    print(f"  window step (median)   on/off  {spread(steps, '{:.2f}')}")
    print(f"  closing step           on/off  {spread(closes, '{:.2f}')}")
    print(f"  what shapes add, as a share of a {AMORTISE_OVER_S / 60:.0f}-min run  "
          f"{med(extra) * 100:.3f} %")


def micro_benchmark(n: int = 200_000) -> None:
    """Per-call cost of the Session's hot path (no window attached), fake run dir."""
    from doctor.record.session import STEP_OPTIMIZER, Session

    with tempfile.TemporaryDirectory(prefix="doctor-micro-") as tmp:
        s = Session(Path(tmp), rank=0)
        clock = time.perf_counter_ns
        s.record_interval("loader_wait", 0, 1)  # create the rings outside the timing
        s.record_optimizer_start()
        s.record_optimizer_end(0)
        s.mark_step(STEP_OPTIMIZER)
        cases = {
            "record_interval": lambda: s.record_interval("loader_wait", 1, 2, 0),
            "record_optimizer_start+end": lambda: (s.record_optimizer_start(),
                                                   s.record_optimizer_end(0)),
            "count_step": lambda: s.count_step(STEP_OPTIMIZER),
            "mark_step": lambda: s.mark_step(STEP_OPTIMIZER, 0),
            "perf_counter_ns (reference)": clock,
            "empty lambda (loop floor)": lambda: None,
        }
        print(f"\n== Session hot path, {n} calls each, ns per call (best of 3) ==")
        for name, fn in cases.items():
            best = float("inf")
            for _ in range(3):
                t0 = clock()
                for _ in range(n):
                    fn()
                best = min(best, (clock() - t0) / n)
            print(f"  {name:<30} {best:>7.0f}")
        s.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--jobs", default=",".join(DEFAULT_STEPS),
                    help="comma-separated sample jobs (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=0,
                    help="override the steps of every job (default: per job, ~20-30 s loop)")
    ap.add_argument("--window", default=None,
                    help="passed to doctor run --window (START,STEPS or off; default: doctor's)")
    ap.add_argument("--shapes", choices=sorted(SHAPES_VARIANTS), default="on",
                    help="the window records input shapes (on, doctor's default), not (off: "
                         "DOCTOR_SHAPES=off), or both, pair by pair")
    ap.add_argument("--job-args", default="",
                    help="extra arguments for every job, e.g. '--threads 1' (one string)")
    ap.add_argument("--probes-off", default="", metavar="NAMES",
                    help="probes left off in the doctor runs, comma-separated (DOCTOR_PROBES_OFF), "
                         "e.g. memory,model_state,ddp")
    ap.add_argument("--rewindow", default=None, metavar="VALUE",
                    help="DOCTOR_REWINDOW for the doctor runs: off, or the detector's constants "
                         "(e.g. gap=0,sustain_min=32,sustain_fraction=0)")
    ap.add_argument("--hook-rounds", type=int, default=20,
                    help="rounds of the per-probe CPU cost per step (bench/step_hooks.py; 0: skip)")
    ap.add_argument("--keep", type=Path, default=None,
                    help="copy each doctor run directory under this folder")
    ap.add_argument("--no-warmup", action="store_true",
                    help="skip the discarded bare run before each job's pairs")
    ap.add_argument("--no-micro", action="store_true",
                    help="skip the Session hot-path micro-benchmark")
    args = ap.parse_args()
    if args.pairs < 1:
        ap.error("--pairs must be at least 1")
    jobs = [j.strip() for j in args.jobs.split(",") if j.strip()]
    for job in jobs:
        if not (JOBS / f"{job}.py").is_file():
            ap.error(f"no sample job {job!r} in {JOBS}")
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    window_on = args.window is None or args.window.strip().lower() != "off"

    load0 = os.getloadavg()
    print(f"doctor overhead: {len(jobs)} job(s) x {args.pairs} pairs, window "
          f"{args.window or 'default'}, {os.cpu_count()} cores, python {sys.version.split()[0]}"
          + (f", probes off: {args.probes_off}" if args.probes_off else ""))
    print(f"load average at start: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} "
          "(figures are noisy when anything else runs on this machine)")
    t_all = time.perf_counter()
    for job in jobs:
        steps = args.steps or DEFAULT_STEPS.get(job, 500)
        job_cmd = job_command(job, steps, shlex.split(args.job_args))
        if not args.no_warmup:
            run(job_cmd)
        variants = SHAPES_VARIANTS[args.shapes]
        pairs: dict[str, list[Pair]] = {v: [] for v in variants}
        for i in range(args.pairs):
            for v in variants:
                env = {**(SHAPES_ENV[v] or {}),
                       **({"DOCTOR_REWINDOW": args.rewindow} if args.rewindow else {})}
                pairs[v].append(run_pair(job_cmd, args.window, args.keep, f"{job}-{v}-{i + 1}",
                                         env or None, args.probes_off,
                                         doctor_first=i % 2 == 1))
            print(f"  {job}: pair {i + 1}/{args.pairs} done", file=sys.stderr, flush=True)
        for v in variants:
            report(" ".join([job, *job_cmd[2:], f"(window shapes {v})"]), pairs[v], window_on)
        if len(variants) == 2 and window_on:
            shapes_report(pairs["on"], pairs["off"])
    if not args.no_micro:
        micro_benchmark()
        if args.hook_rounds > 0:
            print(f"\n== each job-side probe's CPU time per step (bench/step_hooks.py, "
                  f"{args.hook_rounds} rounds) ==", flush=True)
            subprocess.run([sys.executable, str(ROOT / "bench" / "step_hooks.py"),
                            "--rounds", str(args.hook_rounds)], check=False)
    load1 = os.getloadavg()
    print(f"\nload average at end: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}; "
          f"{time.perf_counter() - t_all:.0f} s in all")


if __name__ == "__main__":
    main()
