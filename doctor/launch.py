"""``doctor run``: start the job as a child with the bootstrap on its path, sample it from
outside, and hand back its exit status unchanged.

The child inherits stdin, stdout and stderr, so the job's output is exactly what it would be
without doctor. SIGTERM (and SIGINT when it did not come from the terminal, which already sent
it to the whole foreground process group) is forwarded to the job. A death by signal N is
returned as 128+N, as a shell reports it.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any

from doctor import probes
from doctor.after_job import PROBE as AFTER_JOB_PROBE
from doctor.after_job import measure_after_job
from doctor.bootstrap import ENV_RUN_DIR
from doctor.command import JobCommand
from doctor.exit_wait import ExitWait
from doctor.job_record import BOOTSTRAP_DIR, RunEnd, run_record
from doctor.progress import Say, WindowProgress, start_line
from doctor.record.tracer import ENV_PARENT_PID
from doctor.record.window import ENV_WINDOW, Window, window_of
from doctor.report_warmup import ReportWarmup
from doctor.sampler import SAMPLE_INTERVAL_S, ParentSampler
from doctor.store.rundir import write_run_record
from doctor.verdict import ProbeStatus

ENV_PROBES_DIR = "DOCTOR_PROBES_DIR"  # where the bootstrap finds doctor.probes (sitecustomize)
QUIET_KINETO = "6"


@dataclass
class JobResult:
    exit_code: int  # as a shell reports it: 128+N after a death by signal N
    signal: int | None
    duration_s: float
    probes: dict[str, ProbeStatus]
    timed_out: bool = False
    bare: bool = False  # run without doctor: its run directory could not be written
    unwritten: OSError | None = None  # run.json could not be written at the end


def job_environment(run_dir: Path, window: Window | None,
                    base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(BOOTSTRAP_DIR) + (os.pathsep + path if path else "")
    env[ENV_RUN_DIR] = str(run_dir)
    env[ENV_PROBES_DIR] = str(probes_dir())
    env[ENV_PARENT_PID] = str(os.getpid())
    # Kineto prints profiler start/stop lines on stderr; keep the job's stderr its own.
    env.setdefault("KINETO_LOG_LEVEL", QUIET_KINETO)
    if window is not None:
        env[ENV_WINDOW] = str(window)
    return env


def probes_dir() -> Path:
    """Where doctor.probes lives: beside doctor/ in a source checkout, inside it installed."""
    return Path(probes.__file__).resolve().parent


@dataclass(frozen=True)
class Launch:
    """How ``doctor try`` starts a job instead of as typed (``doctor run`` uses the defaults,
    and imports its report's modules while the job starts: ``warm_report``):
    the environment it starts from, where it runs, where its output goes, how long it may
    take before it is stopped (SIGTERM, then SIGKILL), and who hears doctor's progress lines
    (doctor.progress: the start, the deep window; None, the default, says nothing)."""

    env: Mapping[str, str] | None = None
    cwd: str | None = None
    stdout: IO[Any] | None = None
    stderr: IO[Any] | None = None
    timeout_s: float | None = None
    measure_handoff: bool = True  # measure the machine after the job (doctor.after_job)
    warm_report: bool = False  # import the report's modules while the job starts
    progress: Say | None = None


def run_job(command: JobCommand, run_dir: Path, *, window: Window | None = None,
            clock: Callable[[], float] = time.monotonic, launch: Launch = Launch()
            ) -> JobResult:
    from doctor.probes import PARENT, ParentContext, probes_of
    from doctor.record.bytecode import compile_missing, in_job_sources

    # each process of the job then starts without compiling doctor's modules (bytecode.py)
    compile_missing(in_job_sources(probes_dir()))
    started = time.time()
    t0 = clock()
    env = job_environment(run_dir, window, launch.env)
    job_window = window_of(env)  # the bootstrap's (one inherited unchecked: checked here)
    try:
        write_run_record(run_dir, run_record(command.argv, command.name, started, t0,
                                             exit_code=None, cwd=launch.cwd, env=env))
    except OSError as err:
        if no_room(err) is None:
            raise
        _remove_if_empty(run_dir)
        return run_bare(command, run_dir, err, launch)
    try:
        proc = subprocess.Popen(command.argv, env=env, cwd=launch.cwd, stdout=launch.stdout,
                                stderr=launch.stderr)
    except OSError as err:
        from doctor.errors import UsageError

        raise UsageError(f"cannot start {command.argv[0]}: {err.strerror or err}") from err

    restore = _forward_signals(proc)
    samplers = ParentSampler(ParentContext(run_dir, proc.pid, clock, t0), probes_of(PARENT),
                             interval_s=SAMPLE_INTERVAL_S, clock=clock)
    progress = _start_progress(launch.progress, command, run_dir, job_window, samplers)
    deadline = t0 + launch.timeout_s if launch.timeout_s else None
    ended: list[int] = []  # the job's status, once it ended (or was stopped at the deadline)
    timed_out = False
    exit_wait = ExitWait(proc)
    cpu0 = time.process_time()  # the parent's own CPU while the job runs: its always-on cost
    warmup = ReportWarmup().start() if launch.warm_report else None  # a one-off cost, apart

    def wait(seconds: float) -> bool:
        nonlocal timed_out
        status = exit_wait.wait(seconds)
        if status is not None:
            ended.append(status)
            return True
        if deadline is not None and clock() > deadline:
            timed_out = True
            ended.append(_terminate(proc))
            return True
        return False

    def after_tick() -> None:
        nonlocal progress
        if progress is not None:
            progress = _progress_step(progress, lambda p: p.tick(clock()))

    try:
        samplers.run(wait, after_tick)
    finally:
        exit_wait.close()
        restore()
    rc = ended[0]
    duration = clock() - t0
    parent_cpu_s = time.process_time() - cpu0 - (warmup.cpu_s() if warmup else 0.0)
    if progress is not None:
        _progress_step(progress, WindowProgress.finish)
    host = samplers.running.get("host")
    probes = samplers.stop()
    deaths = [e.to_dict() for e in getattr(host, "exits", [])]
    after = measure_after_job(run_dir, env) if launch.measure_handoff else None
    if after is not None:
        probes[AFTER_JOB_PROBE] = after.status
    sig = -rc if rc < 0 else None
    exit_code = 128 + sig if sig is not None else rc
    end = RunEnd(exit_code, duration, probes, signal=sig,
                 fd_handoff_s=after.fd_handoff_s if after else None,
                 peaks=after.peaks if after else None, links=after.links if after else None,
                 deaths=deaths, timed_out=timed_out, sampler_cpu_s=round(parent_cpu_s, 3))
    record = run_record(command.argv, command.name, started, t0, cwd=launch.cwd, env=env,
                        **end.to_dict())
    try:
        write_run_record(run_dir, record)
    except OSError as err:  # a full disk at the end: the job's status stays its own
        return JobResult(exit_code, sig, duration, probes, timed_out, unwritten=err)
    return JobResult(exit_code, sig, duration, probes, timed_out)


#: The errors of a disk that is full, read-only or failing: where the run directory cannot be
#: written at the start, doctor runs the job without itself (a user asked for the job to run;
#: the profile is what can wait), and says so in one line.
NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG})


def no_room(err: BaseException | None) -> OSError | None:
    """The error of a full, read-only or failing disk that ``err`` is, or was raised from."""
    while err is not None:
        if isinstance(err, OSError) and err.errno in NO_ROOM:
            return err
        err = err.__cause__
    return None


def no_room_line(where: Path, err: OSError, what: str) -> str:
    return f"doctor: cannot write {where} ({err.strerror or err}): {what}"


def run_bare(command: JobCommand, run_dir: Path, err: OSError, launch: Launch = Launch()
             ) -> JobResult:
    """Run the job as it is, without doctor (no bootstrap, no samplers, no run directory),
    after one line saying why; its exit status is its own."""
    print(no_room_line(run_dir, err, "running the job without doctor"), file=sys.stderr,
          flush=True)
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(command.argv, env=launch.env, cwd=launch.cwd,
                                stdout=launch.stdout, stderr=launch.stderr)
    except OSError as start_err:
        from doctor.errors import UsageError

        raise UsageError(f"cannot start {command.argv[0]}: "
                         f"{start_err.strerror or start_err}") from start_err
    restore = _forward_signals(proc)
    timed_out = False
    try:
        try:
            rc = proc.wait(timeout=launch.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            rc = _terminate(proc)
    finally:
        restore()
    sig = -rc if rc < 0 else None
    return JobResult(128 + sig if sig is not None else rc, sig, time.monotonic() - t0, {},
                     timed_out, bare=True)


def _remove_if_empty(run_dir: Path) -> None:
    """Take back a run directory made just now that nothing could be written into."""
    try:
        run_dir.rmdir()
    except OSError:
        pass


def _start_progress(say: Say | None, command: JobCommand, run_dir: Path,
                    window: Window, samplers: ParentSampler) -> WindowProgress | None:
    """Say what the run records, now that the parent's probes have started; the reporter of
    the deep window's lines (None when nobody listens, or when saying failed)."""
    if say is None:
        return None
    try:
        say(start_line(command.name, run_dir, samplers.status, window))
    except Exception:  # a line doctor could not print never stops the job
        return None
    return WindowProgress(run_dir, say, stacks=lambda: "stacks" in samplers.running)


def _progress_step(progress: WindowProgress,
                   step: Callable[[WindowProgress], None]) -> WindowProgress | None:
    """One step of the progress lines; None from then on where it failed (a line doctor
    could not say is no reason to disturb the job or its report)."""
    try:
        step(progress)
    except Exception:  # said in the docstring: progress is a courtesy
        return None
    return progress


def _terminate(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> int:
    """Stop a job that ran past its time: SIGTERM, then SIGKILL after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            proc.send_signal(sig)
            return proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            continue
        except OSError:
            break
    return proc.wait()


def _forward_signals(proc: subprocess.Popen[bytes]) -> Callable[[], None]:
    def forward(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and _terminal_sent_it():
            return  # the job got it from the terminal already
        try:
            proc.send_signal(signum)
        except OSError:
            pass

    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        try:
            previous[signum] = signal.signal(signum, forward)
        except (ValueError, OSError):  # not the main thread, or not allowed
            pass

    def restore() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    return restore


def _terminal_sent_it() -> bool:
    """True when we are in the terminal's foreground group (so Ctrl-C reached the job too)."""
    try:
        return os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
    except (OSError, ValueError, AttributeError):
        return False

