"""One attempt of a try: the run's own command, run again with a setting applied (or none, for
the baseline), stopped after its steps, and its steps measured by the one analysis.

The job runs as it was recorded (doctor.tries.attempt.RecordedJob): the same argv and working
directory, and the environment of the shell doctor try runs in with the job-shaping variables
of the run (run.json ``env``) put back as they were. Its output goes to the attempt's folder
(the tail is kept); the profiler window is off, so that the steps measured are plain steps.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from doctor.command import JobCommand
from doctor.errors import UsageError
from doctor.job_record import RECORDED_ENV, recorded_env
from doctor.launch import Launch, run_job
from doctor.pipeline import analyze_run
from doctor.record.overrides import ENV_APPLY
from doctor.record.stop import ENV_STOP_AFTER
from doctor.record.window import OFF
from doctor.reports.escape import escaped
from doctor.reports.json import render_json
from doctor.store import layout
from doctor.store.redact import REDACTED, is_redacted
from doctor.store.run_json import read_run_json
from doctor.store.safe_files import open_new, write_text_atomic
from doctor.store.tries import keep_tail, output_paths, process_notes
from doctor.tries.measure import AttemptResult
from doctor.tuning import Apply

STDERR_SHOWN = 2000  # characters of a failed attempt's stderr kept in try.json


@dataclass(frozen=True)
class RecordedJob:
    """The job as the run recorded it, ready to start again."""

    argv: list[str]
    name: str
    cwd: str
    env: dict[str, str]
    notes: list[str] = field(default_factory=list)  # how the environment differs from now


#: Of the names run.json records (doctor.job_record.RECORDED_ENV), those doctor try puts back: the
#: job-shaping ones. PYTHONPATH is this shell's: a received run's would choose what the job
#: imports. Any other name a run.json holds (LD_PRELOAD, BASH_ENV, PATH, PYTHONSTARTUP...) is
#: never applied, and the plan says it was dropped.
RESTORED_ENV = tuple(p for p in RECORDED_ENV if p != "PYTHONPATH")
_ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]*")


def restorable(name: str) -> bool:
    """Whether doctor try puts ``name`` back as the run recorded it (or unsets it to match)."""
    return (_ENV_NAME.fullmatch(name) is not None and name.startswith(RESTORED_ENV)
            and bool(recorded_env({name: ""})))


def _restore_env(env: dict[str, str], recorded: dict[Any, Any], notes: list[str]) -> None:
    """Put the job-shaping names of ``recorded`` (run.json ``env``) back into ``env``."""
    dropped = sorted(escaped(str(k)) for k, v in recorded.items()
                     if not (isinstance(k, str) and restorable(k) and isinstance(v, str)
                             and "\0" not in v))
    kept = {k: v for k, v in recorded.items() if isinstance(k, str) and restorable(k)
            and isinstance(v, str) and "\0" not in v}
    for key in list(env):
        if restorable(key) and key not in kept:
            notes.append(f"{key} unset, as when the run was recorded (now {escaped(env[key])!r})")
            del env[key]
    for key, value in kept.items():
        if is_redacted([value]):  # a password doctor did not keep: the shell's, if any
            notes.append(f"{key} as in this shell (its recorded value hides a password)")
            continue
        if env.get(key) != value:
            now = escaped(env[key]) if key in env else None
            notes.append(f"{key}={escaped(value)!r} as recorded (now {now!r})")
        env[key] = value
    if dropped:
        notes.append("not restored from run.json (not a job-shaping name doctor records, or "
                     f"not text): {', '.join(dropped)}")


def recorded_job(run_dir: Path, now: Mapping[str, str] | None = None) -> RecordedJob:
    """The job as run.json recorded it: argv, cwd, and this shell's environment with the
    job-shaping names put back (``now``: the environment to start from, default this one)."""
    run = read_run_json(run_dir)
    env = dict(os.environ if now is None else now)
    notes: list[str] = []
    if run.env is not None:
        _restore_env(env, dict(run.env), notes)
    else:
        notes.append("the run did not record its environment: the job gets this shell's")
    if run.argv_fault in ("not a list", "not text") or run.cwd_fault:
        raise UsageError(f"{run_dir}: run.json's argv is not a list of strings, or its cwd not "
                         "a string: doctor try re-runs only a command recorded as doctor run "
                         "records one")
    argv, cwd = list(run.argv), run.cwd or os.getcwd()
    if is_redacted(argv):
        raise UsageError(f"{run_dir} recorded its command with secrets hidden ({REDACTED}), so "
                         "doctor try cannot run it again: pass the secret by environment "
                         "variable (e.g. HF_TOKEN) and record the run again")
    if run.mode == "watch":  # doctor.watch recorded the script's own sys.argv
        if not argv or not argv[0].endswith(".py"):
            raise UsageError(f"{run_dir} was recorded by doctor.watch in a process that was not "
                             "started from a script: doctor try re-runs scripts; record it with "
                             "doctor run")
        argv = [sys.executable, *argv]
    return RecordedJob(argv, run.name, cwd, env, notes)


def run_attempt(job: RecordedJob, arm: str, round_: int, apply: Apply | None, stop_at: int,
                out: Path, timeout_s: float) -> AttemptResult:
    """Run the job once into ``out`` with ``apply`` (None: as it is), stopped after
    ``stop_at`` steps."""
    out.mkdir(parents=True, exist_ok=True)
    env = dict(job.env)
    env_had: dict[str, str | None] = {}
    if apply:
        for key, value in apply.get("env", {}).items():
            env_had[key] = env.get(key)
            env[key] = value
        rest = {k: v for k, v in apply.items() if k != "env"}
        if rest:
            env[ENV_APPLY] = json.dumps(rest)
    env[ENV_STOP_AFTER] = str(stop_at)
    stdout_path, stderr_path = output_paths(out)
    cpu_before = _cpu_ticks()
    started = time.monotonic()
    with open_new(stdout_path) as so, open_new(stderr_path) as se:
        result = run_job(JobCommand(job.argv, job.name), out, window=OFF,
                         launch=Launch(env=env, cwd=job.cwd, stdout=so, stderr=se,
                                       timeout_s=timeout_s, measure_handoff=False))
    duration = time.monotonic() - started
    steal = _steal_share(cpu_before, _cpu_ticks())
    keep_tail(stdout_path)
    stderr = keep_tail(stderr_path)
    notes = process_notes(out)
    leftover = _stop_leftovers(notes["pids"], time.time() - duration)
    attempt = AttemptResult(
        arm=arm, round=round_, run_dir=str(out), exit_code=result.exit_code,
        stopped=bool(notes["stopped"]), timed_out=result.timed_out,
        tried=notes["tried"], errors=list(notes["errors"]), duration_s=duration,
        steal_share=steal)
    if leftover:
        attempt.errors.append(f"{leftover} process(es) of the job outlived it and were stopped")
    try:
        analysis = analyze_run(out)
    except Exception as err:  # an attempt that left nothing readable is a failed attempt
        attempt.errors.append(f"could not analyse the attempt: {type(err).__name__}: {err}")
        attempt.exit_code = attempt.exit_code or 1
        attempt.stopped = False
    else:
        write_text_atomic(out / layout.VERDICT, render_json(analysis))
        ledger = analysis.ledger
        if not ledger.empty:
            attempt.steps_run = len(ledger)
            attempt.startup_s = max(0.0, float(ledger["start_s"].min()))
            attempt.steps_time_s = float(ledger["wall_s"].sum())
            attempt.step_s = [float(x) for x in ledger.loc[ledger["analyzed"], "wall_s"]]
    if attempt.failed:
        attempt.stderr_tail = stderr[-STDERR_SHOWN:]
    for key, had in env_had.items():  # what the job had of the variables the try set
        attempt.tried[f"env.{key}"] = {"tried": env[key], "job": [had], "applied": 1}
    return attempt


def _cpu_ticks(path: str = "/proc/stat") -> tuple[int, int] | None:
    """(steal, total) CPU ticks of the machine so far; None where /proc/stat says nothing."""
    try:
        with open(path) as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


def _steal_share(before: tuple[int, int] | None, after: tuple[int, int] | None
                 ) -> float | None:
    """The share of the machine's CPU time that its hypervisor gave to others meanwhile (a
    virtual machine whose host is busy runs the same job slower)."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def _stop_leftovers(pids: list[int], since: float, grace_s: float = 5.0) -> int:
    """Processes of the job (started after ``since``, so not a pid reused by now) still
    running after it ended, such as workers a job left behind: given a moment, then stopped.
    How many there were."""
    alive = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            if proc.create_time() >= since - 1.0 and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.Error:
            continue
    if not alive:
        return 0
    _gone, still = psutil.wait_procs(alive, timeout=grace_s)
    for proc in still:
        try:
            proc.kill()
        except psutil.Error:
            pass
    return len(still)
