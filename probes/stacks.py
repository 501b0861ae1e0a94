"""Stacks probe: where the job's processes spend their time, by Python stack samples.

Two recorders write the same thing through the store (doctor.store.stacks: py-spy's raw format,
and how the samples were taken; doctor.store.stack_times: the same samples on the time axis, so
that a slow step's own samples can be told from the others'):

- py-spy, one ``py-spy record --pid P`` per process (the main process and each DataLoader
  worker), started by the ``doctor run`` parent when a rank's profiler window opens. Never
  ``--subprocesses`` (it keeps rescanning the tree: 8-36 % of step time here). Blocking where
  it can: reading a running interpreter's stack without pausing it loses tight Python loops (a
  get_batch() loop that took 77 % of the time showed as 55 %); pausing it for each of the 50
  samples a second, during the 8 s of the window only, is the price of the truth. But each pause
  stops every thread and reads every Python thread's stack: per process, the parent counts its
  threads (and those that run) as its window opens and picks the plan that keeps the pauses
  within budget (doctor.probes.stack_plan): a lower rate for longer, or, past that,
  ``--nonblocking`` (said in the report, with the under-count it may cause). py-spy writes a
  chrome trace (``--format chrometrace``: its samples with their times), which the parent turns
  into the raw format and the runs of samples as it reaps py-spy.
- an in-process sampler thread, when py-spy is missing, refused (a container without
  SYS_PTRACE, Yama, a policy that lets py-spy read a process but not pause it) or failing:
  the parent checks py-spy on a throwaway process before any window opens
  (doctor.probes.py_spy), says so in the run's control file (doctor.store.control), and the
  main process samples from its window's start, each worker from its third batch. Where
  py-spy fails only on the job's own processes, once their window has opened, the parent says
  so then, and a main process that listens for LATE_WAIT_S after its window opened starts
  sampling as soon as it hears. It listens at its step boundaries (at most every LATE_POLL_S),
  with no thread of its own: a listening thread lived 10 s in every job, which a job that
  joins all its threads waited for (4 s became 15 s) and ``threading.enumerate()`` showed.

Both keep *every* sample of the process's main thread, running or blocked (py-spy ``--idle
--threads``, keeping the thread whose id is the pid), so that sample counts are proportional to
wall time: a read that blocks on storage shows as its read frame, as often as it lasts. Counting
only running samples, and converting counts into seconds with the rate and the span, read
phantom blocked time wherever py-spy fell behind its rate or outlived the process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from ..record.tracer import ENV_PARENT_PID
from ..store import layout
from ..store.control import IN_PROCESS, in_process_stacks, post_stacks_mode, read_control
from ..store.layout import stack_times_names
from ..store.stack_times import Run, convert_chrometrace, write_stack_times
from ..store.stacks import write_stacks, write_stacks_meta
from ..verdict import ProbeStatus
from .py_spy import (
    MISSING_HINT,
    PTRACE_HINT,
    find_py_spy,
    py_spy_refusal,
    record_failure,
)
from .stack_plan import (
    ENV_STACKS,
    RATE_HZ,
    SPAN_S,
    SamplingPlan,
    Threads,
    sampling_plan,
    thread_counts,
)

if TYPE_CHECKING:
    from ..record.session import Session
    from . import ParentContext

FLUSH_S = 0.5  # the in-process sampler writes what it has this often
LATE_WAIT_S = 10.0  # how long a main process listens for a fallback asked after its window opened
LATE_POLL_S = 0.25


# ---- in the job: the fallback sampler ------------------------------------------------------

def request_in_process_stacks(run_dir: Path, reason: str) -> None:
    """Ask every process of the job to sample its own stacks (no py-spy from outside)."""
    post_stacks_mode(run_dir, IN_PROCESS, reason)


def sample_own_stacks_if_asked(session: Session) -> None:
    """Where the parent asked for it, sample the calling thread of this process (the training
    or worker loop) from now on. A main process under ``doctor run`` that was not asked yet
    listens a few seconds more (LATE_WAIT_S): where py-spy fails on it once its window opened,
    the parent asks then, and the sampler starts as soon as it hears."""
    try:
        target = threading.get_ident()
        if in_process_stacks(session.run_dir):
            InProcessSampler(session.directory, target).start()
        elif session.role == "main" and os.environ.get(ENV_PARENT_PID):
            LateAsk(session, target).listen()
    except Exception as err:  # stacks are evidence, never a reason to fail the job
        session.swallowed("stacks", "starting the in-process stack sampler", err)


class LateAsk:
    """Starts sampling ``target`` if the parent asks for the in-process sampler within
    ``wait_s`` (py-spy refused on this process after its window opened): read at the step
    boundaries, at most every ``poll_s``."""

    def __init__(self, session: Session, target: int, wait_s: float = LATE_WAIT_S,
                 poll_s: float = LATE_POLL_S) -> None:
        self.session = session
        self.target = target
        self.poll_s = poll_s
        now = time.monotonic()
        self.deadline = now + wait_s
        self.next = now + poll_s

    def listen(self) -> None:
        self.session.on_step(self.on_step)

    def on_step(self, count: int) -> None:
        now = time.monotonic()
        if now < self.next:
            return
        self.next = now + self.poll_s
        try:
            if in_process_stacks(self.session.run_dir):
                self.session.off_step(self.on_step)
                InProcessSampler(self.session.directory, self.target).start()
            elif now >= self.deadline:
                self.session.off_step(self.on_step)
        except Exception as err:  # stacks are evidence, never a reason to fail the job
            self.session.off_step(self.on_step)
            self.session.swallowed("stacks", "starting the in-process stack sampler", err)


class InProcessSampler:
    """Samples one thread of this process at ``rate_hz`` for ``span_s``, from a daemon thread,
    running or blocked alike (as py-spy ``--idle``)."""

    def __init__(self, proc_dir: Path, thread_id: int, *,
                 rate_hz: float = RATE_HZ, span_s: float = SPAN_S,
                 clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self.proc_dir = proc_dir
        self.thread_id = thread_id
        self.rate_hz = rate_hz
        self.span_s = span_s
        self.clock = clock
        self._thread = threading.Thread(target=self._run, name="doctor-stacks", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        stacks: Counter[tuple[str, ...]] = Counter()
        runs: list[Run] = []  # runs of identical samples, microseconds from the start
        period = 1.0 / self.rate_hz
        start = self.clock()
        taken = 0
        deadline = time.monotonic() + self.span_s
        next_at = time.monotonic()
        flush_every = max(1, int(self.rate_hz * FLUSH_S))
        while next_at < deadline:
            frame = sys._current_frames().get(self.thread_id)
            if frame is None:
                break
            taken += 1
            stack = _stack(frame)
            del frame
            stacks[stack] += 1
            at = (self.clock() - start) // 1000
            if runs and runs[-1][2] == stack:
                runs[-1] = (runs[-1][0], at, stack)
            else:
                if runs:
                    runs[-1] = (runs[-1][0], at, runs[-1][2])
                runs.append((at, at, stack))
            if taken % flush_every == 0 and not self._flush(stacks, runs, start, taken):
                # a DataLoader worker may be ended at any time (os._exit, no atexit): what is
                # sampled so far is kept on disk; where that fails (a full disk), it stops
                return
            next_at += period
            time.sleep(max(0.0, next_at - time.monotonic()))
        self._flush(stacks, runs, start, taken)

    def _flush(self, stacks: Counter[tuple[str, ...]], runs: list[Run], start: int,
               taken: int) -> bool:
        """Write the samples so far, and their runs (the last one lasting a period);
        False where they could not be written."""
        last = round(1e6 / self.rate_hz)
        try:
            write_stack_times(self.proc_dir, [*runs[:-1], *((r[0], r[1] + last, r[2])
                                                             for r in runs[-1:])])
            write_stacks(self.proc_dir, stacks, recorder="in-process", rate_hz=self.rate_hz,
                         start_ns=start, end_ns=self.clock(), taken=taken)
        except OSError:
            return False
        return True


def _stack(frame: FrameType | None) -> tuple[str, ...]:
    out = []
    while frame is not None:
        code = frame.f_code
        out.append(f"{code.co_qualname} ({code.co_filename}:{frame.f_lineno})"
                   if hasattr(code, "co_qualname") else
                   f"{code.co_name} ({code.co_filename}:{frame.f_lineno})")
        frame = frame.f_back
    return tuple(reversed(out))


# ---- in the doctor run parent: py-spy per process ------------------------------------------

class PySpyRecorder:
    """Starts one py-spy per process of a rank when that rank's window opens, and again when
    it opens a later window (its samples then go to stacks-N.txt). The in-process fallback
    samples beside the first window only."""

    name = "stacks"

    def __init__(self, run_dir: Path, *, rate_hz: float = RATE_HZ, span_s: float = SPAN_S,
                 clock: Callable[[], int] = time.perf_counter_ns,
                 py_spy: str | None = None,
                 count_threads: Callable[[list[int]], dict[int, Threads | None]] = thread_counts
                 ) -> None:
        self.run_dir = run_dir
        self.count_threads = count_threads
        self.rate_hz = rate_hz
        self.span_s = span_s
        self.clock = clock
        asked = os.environ.get(ENV_STACKS) == IN_PROCESS
        if py_spy is None:
            py_spy = "" if asked else find_py_spy()
        self.py_spy = py_spy
        self._missing = (f"{ENV_STACKS}={IN_PROCESS}" if asked else "py-spy is not installed")
        self._missing_hint = "" if asked else MISSING_HINT
        self._started: set[tuple[int, int, int]] = set()  # rank, pid, window
        self._running: list[tuple[subprocess.Popen[bytes], Path, int, SamplingPlan, int]] = []
        self.status = ProbeStatus(True)
        self.fallback_reason = ""
        self._stopping = threading.Event()  # the run ended: the check of py-spy stops too
        self._checker: threading.Thread | None = None

    @classmethod
    def for_run(cls, context: ParentContext) -> PySpyRecorder:
        return cls(context.run_dir)

    def check(self) -> ProbeStatus:
        """Always on: py-spy, or where it cannot run, the in-process sampler (said here)."""
        return self.status

    def start(self) -> None:
        if not self.py_spy:
            self._request_fallback(self._missing, self._missing_hint)
            return
        # find out now, long before the first window, whether ptrace is allowed
        self._checker = threading.Thread(target=self._check_ptrace, name="doctor-ptrace-check",
                                         daemon=True)
        self._checker.start()

    def _check_ptrace(self) -> None:
        assert self.py_spy is not None
        refusal = py_spy_refusal(self.py_spy, os.getpid(), stop=self._stopping)
        if refusal is not None and not self._stopping.is_set():
            self._request_fallback(*refusal)

    def sample(self) -> None:
        """Called at the parent's tick: start recorders for newly opened windows, reap others.
        The processes of every window opened since the last tick have their threads counted
        together, in one short watch (ranks open their windows on the same step)."""
        self._reap()
        if self.fallback_reason:
            return
        targets: list[tuple[Path, int, int]] = []  # folder, pid, window
        control = read_control(self.run_dir)
        opened = [(rank, pid, 1) for rank, pid in control.open_windows()]
        opened += [(rank, pid, n) for (rank, pid), ns in control.later.items() for n in ns]
        for rank, pid, window in opened:
            if (rank, pid, window) in self._started:
                continue
            self._started.add((rank, pid, window))
            main_dir = layout.process_dir(self.run_dir, rank, "main", pid)
            targets += [(d, p, window) for d, p in
                        [(main_dir, pid), *_worker_dirs(self.run_dir, rank, pid)]]
        if not targets:
            return
        counts = self.count_threads([target for _, target, _ in targets])
        for target_dir, target, window in targets:
            self._spawn(target_dir, target, counts.get(target), window)

    def _spawn(self, proc_dir: Path, pid: int, threads: Threads | None, window: int = 1) -> None:
        assert self.py_spy is not None
        plan = sampling_plan(threads, self.rate_hz, self.span_s, os.environ.get(ENV_STACKS))
        cmd = [self.py_spy, "record", "--pid", str(pid), "--rate", str(round(plan.rate_hz)),
               "--duration", str(max(1, round(plan.span_s))), "--full-filenames",
               "--idle", "--threads", *([] if plan.blocking else ["--nonblocking"]),
               "--format", "chrometrace",
               "--output", str(proc_dir / stack_times_names(window)[1])]
        try:
            # py-spy prints its summary ("Samples: N") on stdout, its errors on stderr
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except OSError as err:
            self._request_fallback(f"py-spy could not start: {err}")
            return
        self._running.append((proc, proc_dir, self.clock(), plan, window))

    def _reap(self) -> None:
        still = []
        abandon = False
        for proc, proc_dir, start, plan, window in self._running:
            if proc.poll() is None:
                still.append((proc, proc_dir, start, plan, window))
                continue
            err = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            # py-spy's chrome trace becomes the raw samples and their times (stack_times)
            converted = convert_chrometrace(proc_dir, plan.rate_hz, window)
            if proc.returncode != 0 and not converted:
                if window > 1:
                    continue  # a later window's samples only: the first's recorder stays
                if not self.fallback_reason:
                    self._request_fallback(*record_failure(err, proc.returncode))
                    abandon = True
                continue
            write_stacks_meta(proc_dir, recorder=plan.recorder, rate_hz=round(plan.rate_hz),
                              start_ns=start, end_ns=self.clock(), taken=_samples_taken(err),
                              busy_threads=plan.busy_threads, threads=plan.threads,
                              window=window)
        if abandon:  # the in-process sampler takes every process over: one writer per folder
            for proc, *_rest in still:
                proc.kill()  # killed, py-spy writes nothing
                proc.wait()
            still = []
        self._running = still

    def _request_fallback(self, reason: str, hint: str = PTRACE_HINT) -> None:
        self.fallback_reason = reason
        self.status = ProbeStatus(True, f"in-process sampler ({reason})", hint)
        try:
            request_in_process_stacks(self.run_dir, reason)
        except OSError:
            pass

    def stop(self) -> None:
        self._stopping.set()
        if self._checker is not None:
            self._checker.join(timeout=5)
        for proc, *_rest in self._running:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)  # py-spy writes what it has on SIGINT
        deadline = time.monotonic() + 5
        for proc, *_rest in self._running:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
        self._reap()


def _worker_dirs(run_dir: Path, rank: int, main_pid: int) -> list[tuple[Path, int]]:
    """Live DataLoader workers of ``main_pid``: their folders (created at their first fetch)."""
    try:
        import psutil

        children = {p.pid for p in psutil.Process(main_pid).children()}
    except Exception:  # the process may be gone; then there is nothing to sample
        return []
    return [(d, pid) for d, r, role, pid in layout.process_dirs(run_dir)
            if r == rank and role.startswith("worker") and pid in children]


def _samples_taken(stderr: str) -> int:
    marker = "Samples: "
    if marker in stderr:
        tail = stderr.rsplit(marker, 1)[1].split()[0]
        if tail.isdigit():
            return int(tail)
    return 0


__all__ = [
    "InProcessSampler",
    "PySpyRecorder",
    "find_py_spy",
    "request_in_process_stacks",
    "sample_own_stacks_if_asked",
]
