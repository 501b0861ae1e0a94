"""``doctor try``: re-run a run's own command with fixes applied and measure the speedup.

    prepare (the run, its analysis, the candidates, the steps) -> confirm -> rounds of
    attempts (the baseline, then each candidate, ``repeat`` times) -> measure -> try.json

Each attempt runs ``warm-up + steps/repeat`` steps and is stopped there (doctor.record.stop),
so every arm is measured over about ``steps`` steady steps in all. The try goes into
``RUN_DIR/tries/<stamp>/``, and the run's own verdict and report are written again so that
each fix tried says what was measured.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from doctor.errors import Interrupted, UsageError
from doctor.pipeline import analyze_run
from doctor.reports.escape import escaped, shell_command, shell_word
from doctor.store.claim import share_run_dir
from doctor.store.redact import redact_argv
from doctor.store.tries import attempt_dir, merge_tried, new_try_dir, write_try
from doctor.store.try_record import TryCandidate, TryRecord
from doctor.tries.attempt import RecordedJob, recorded_job, run_attempt
from doctor.tries.measure import (
    AttemptResult,
    measure,
    outcome,
    pace,
    ratio,
    steadiness,
    unsettled,
)
from doctor.tries.plan import Plan, plan_try

DEFAULT_STEPS = 30  # steady steps each arm is measured over, in all
DEFAULT_REPEAT = 2
MIN_ATTEMPT_STEPS = 10
MIN_WARMUP = 3
BASELINE = "baseline"
INTERRUPTED = 130  # the job's status after SIGINT (128 + 2)


@dataclass
class Prepared:
    run_dir: Path
    job: RecordedJob
    plan: Plan
    steps: int
    repeat: int
    per_attempt: int
    stop_at: int
    timeout_s: float
    original_step_s: float
    notes: list[str] = field(default_factory=list)

    @property
    def attempts(self) -> int:
        return self.repeat * (1 + len(self.plan.candidates))


def prepare(run_dir: Path, fixes: tuple[str, ...] = (), sets: tuple[str, ...] = (),
            steps: int = DEFAULT_STEPS, repeat: int = DEFAULT_REPEAT) -> Prepared:
    if steps < 1 or repeat < 1:
        raise UsageError("--steps and --repeat take numbers of 1 or more")
    job = recorded_job(run_dir)
    if not job.argv:
        raise UsageError(f"{run_dir} does not say what command it ran (run.json has no argv): "
                         "doctor try re-runs runs recorded by doctor run")
    analysis = analyze_run(run_dir)
    ledger = analysis.ledger
    if ledger.empty or not ledger["analyzed"].any():
        raise UsageError(f"{run_dir} has no steps: doctor try stops a job after a number of "
                         "steps, and this job showed none")
    plan = plan_try(analysis.verdict.findings, fixes, sets)
    if not plan.candidates:
        manual = "; ".join(f"{m.id} {m.title}" for m in plan.manual[:4])
        raise UsageError("no fix of this run can be tried without changing its code"
                         + (f" ({manual})" if manual else "")
                         + ": name a setting with --set KEY=VALUE")
    warmup = max(MIN_WARMUP, int(ledger.groupby("rank")["warmup"].sum().max()))
    per_attempt = max(MIN_ATTEMPT_STEPS, math.ceil(steps / repeat))
    stop_at = warmup + per_attempt + 2  # the first mark opens the first step; one to spare
    step_s = float(ledger.loc[ledger["analyzed"], "wall_s"].median())
    startup = max(0.0, float(ledger["start_s"].min()))
    timeout = 3.0 * (startup + stop_at * step_s * 2.0) + 60.0
    return Prepared(run_dir, job, plan, steps, repeat, per_attempt, stop_at, timeout, step_s,
                    list(job.notes))


def plan_lines(p: Prepared) -> list[str]:
    """What will run, said before it runs: the command and its folder as a shell would need them
    typed, every character that is not printable escaped (doctor.reports.escape), so that what a
    received run.json holds cannot draw over the command on the terminal."""
    command = shell_command(redact_argv(p.job.argv))
    lines = [f"doctor try: re-running `{command}` in {shell_word(p.job.cwd)}",
             f"  {p.repeat} round(s) of the baseline and {len(p.plan.candidates)} setting(s): "
             f"{p.attempts} runs of the job, each stopped after step {p.stop_at} "
             f"({p.per_attempt} steady steps)"]
    for c in p.plan.candidates:
        estimate = f"estimated {c.estimate:.2f}x" if c.estimate else "not estimated"
        lines.append(f"    {escaped(c.id):<22} {escaped(c.label)}  ({estimate})")
    if p.plan.manual and not any(c.id.startswith("set:") for c in p.plan.candidates):
        lines.append(f"  not tried, they need code: {', '.join(m.id for m in p.plan.manual)}")
    lines += [f"  environment: {escaped(n)}" for n in p.notes]
    return lines


def execute(p: Prepared, echo: Callable[[str], None]) -> TryRecord:
    """Run the rounds, measure, write ``try.json``; the record."""
    share_run_dir(p.run_dir)  # no doctor run replaces the run while it is being re-run
    try_dir = new_try_dir(p.run_dir)
    started = time.monotonic()
    attempts: list[AttemptResult] = []
    given_up: set[str] = set()
    arms = [(BASELINE, None), *((c.id, c.apply) for c in p.plan.candidates)]
    done = 0
    for round_ in range(1, p.repeat + 1):
        for arm, apply in arms:
            done += 1
            if arm in given_up:
                continue
            a = run_attempt(p.job, arm, round_, apply, p.stop_at,
                            attempt_dir(try_dir, round_, arm), p.timeout_s)
            attempts.append(a)
            echo(_progress(done, p.attempts, round_, arm if apply is None
                           else _label(p, arm), a))
            if a.exit_code == INTERRUPTED and not a.stopped:  # Ctrl-C reached the job too
                write_try(try_dir, _record(p, try_dir, attempts, started))
                raise Interrupted(f"interrupted: what was measured so far is in {try_dir}")
            if a.failed:
                if arm == BASELINE:
                    record = _record(p, try_dir, attempts, started)
                    write_try(try_dir, record)
                    raise UsageError(
                        f"the job fails even as it is (exit status {a.exit_code}), so nothing "
                        f"can be compared: see {Path(a.run_dir) / 'stderr.txt'}")
                given_up.add(arm)  # one failure says it: no more rounds of it
    record = _record(p, try_dir, attempts, started)
    write_try(try_dir, record)
    return record


def run_try(p: Prepared, echo: Callable[[str], None]) -> str:
    """Run the plan (``execute``), write the try's report.html, and update the run's own
    verdict and report with what was measured (a failure there is said through ``echo``, and
    costs only that update); the summary to print."""
    from doctor.outputs import finalize_run
    from doctor.reports.tries import render_try_html, render_try_text
    from doctor.store import layout
    from doctor.store.safe_files import write_text_atomic

    record = execute(p, echo)
    try_dir = Path(record.dir)
    write_text_atomic(try_dir / layout.REPORT, render_try_html(record))
    try:
        finalize_run(p.run_dir)  # the run's own verdict and report now say what was measured
    except Exception as err:
        echo(f"doctor: could not update the run's report: {type(err).__name__}: {err}")
    return render_try_text(record, report=str(try_dir / layout.REPORT))


def _label(p: Prepared, arm: str) -> str:
    return next((c.label for c in p.plan.candidates if c.id == arm), arm)


def _progress(done: int, total: int, round_: int, label: str, a: AttemptResult) -> str:
    what = (f"a step every {a.pace_s * 1e3:.1f} ms over {len(a.step_s)} steps"
            if a.pace_s is not None else "no steps measured")
    if a.failed:
        what = "timed out" if a.timed_out else f"failed (exit status {a.exit_code})"
    return f"doctor try: [{done}/{total}] round {round_}, {label}: {what}"


def _record(p: Prepared, try_dir: Path, attempts: list[AttemptResult], started: float
            ) -> TryRecord:
    base = [a for a in attempts if a.arm == BASELINE]
    rows = []
    for c in p.plan.candidates:
        mine = [a for a in attempts if a.arm == c.id]
        if not mine:
            continue
        m = measure(base, mine)
        result, why = outcome(c.apply, mine, m)
        short = unsettled(mine) if result in ("faster", "slower", "no change") else None
        why = f"{why}; {short}" if short else why
        failed = next((a for a in mine if a.failed), None)
        rows.append(TryCandidate(
            **c.to_dict(), outcome=result, why=why, speedup=m.speedup, low=m.low,
            high=m.high, per_round=m.per_round, pooled=m.pooled,
            ratio=ratio(m.speedup, c.estimate),
            median_step_s=m.candidate_s, steps=m.steps,
            applied=_merged_tried(mine), errors=sorted({e for a in mine for e in a.errors}),
            stderr_tail=failed.stderr_tail if failed else "",
            attempts=[str(Path(a.run_dir).relative_to(try_dir)) for a in mine],
            steal_share=[a.steal_share for a in mine],
        ))
    unsteady = steadiness(base, attempts)
    measured = [r for r in rows if r.outcome == "faster" and r.speedup]
    best = max(measured, key=lambda r: r.speedup or 0.0).id if measured else None
    base_steps = [s for a in base if not a.failed for s in a.step_s]
    base_median = pace(base_steps)
    wall = time.monotonic() - started
    own = p.steps * p.original_step_s  # the job's own tried steps
    stepping = sum(a.steps_time_s for a in attempts)
    startups = sum(a.startup_s for a in attempts)
    return TryRecord(
        run=str(p.run_dir), dir=str(try_dir), command=p.job.argv, cwd=p.job.cwd,
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"), env_notes=p.notes,
        steps=p.steps, steps_per_attempt=p.per_attempt, stop_at_step=p.stop_at,
        repeat=p.repeat, sweep=p.plan.sweep, best=best, unsteady=unsteady,
        baseline={
            "median_step_s": base_median, "steps": len(base_steps),
            "original_median_step_s": p.original_step_s,
            "rounds": [{"round": a.round, "median_step_s": a.pace_s, "steps": len(a.step_s),
                        "steal_share": a.steal_share,
                        "dir": str(Path(a.run_dir).relative_to(try_dir))} for a in base],
        },
        candidates=rows,
        manual=[{"id": m.id, "title": m.title} for m in p.plan.manual],
        # the budget: the time of every step the attempts ran (warm-up included) over the
        # job's own ``steps`` steps; start-ups, exits and the analysis of each attempt apart
        cost={"wall_s": wall, "attempts": len(attempts),
              "steps_run": sum(a.steps_run for a in attempts), "steps_s": stepping,
              "startup_s": startups,
              "exit_s": sum(max(0.0, a.duration_s - a.startup_s - a.steps_time_s)
                            for a in attempts),
              "job_steps_s": own, "ratio_to_job_steps": stepping / own if own else None},
    )


def _merged_tried(attempts: list[AttemptResult]) -> dict[str, Any]:
    """What the attempts' jobs had of each setting, each value once (as text, for try.json)."""
    out: dict[str, Any] = {}
    for setting, entry in merge_tried([a.tried for a in attempts]).items():
        out[setting] = {"tried": entry["tried"], "job": sorted(set(map(str, entry["job"])))}
        if "asked" in entry:
            out[setting]["asked"] = entry["asked"]
    return out
