"""Stacks probe: where the job's processes spend their CPU time, by Python stack samples.

Two recorders write the same thing, ``stacks.txt`` (py-spy's raw format: ``frame;frame;... N``,
outermost frame first, each frame ``function (file:line)``) plus ``stacks.json`` (recorder,
rate, the sampled span on the shared monotonic clock, and the number of samples taken):

- py-spy, one ``py-spy record --pid P`` per process (the main process and each DataLoader
  worker), started by the ``doctor run`` parent when a rank's profiler window opens. Never
  ``--subprocesses`` (it keeps rescanning the tree: 8-36 % of step time here). Not
  ``--nonblocking`` either: reading a running interpreter's stack without pausing it loses tight
  Python loops (a get_batch() loop that took 77 % of the time showed as 55 %); pausing it for
  each of the 50 samples a second, during the 8 s of the window only, is the price of the truth.
- an in-process sampler thread, when py-spy is missing or ptrace is refused (a container without
  SYS_PTRACE, Yama): the main process samples from its window's start, each worker from its
  third batch.

Both keep *every* sample of the process's main thread, running or blocked (py-spy ``--idle
--threads``, keeping the thread whose id is the pid), so that sample counts are proportional to
wall time: a read that blocks on storage shows as its read frame, as often as it lasts. Counting
only running samples, and converting counts into seconds with the rate and the span, read
phantom blocked time wherever py-spy fell behind its rate or outlived the process.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from doctor.verdict import ProbeStatus

RATE_HZ = 50
# How long each process is sampled: ~400 samples. A stage's share of loading is a count of
# samples, with a binomial error: about 2 points at 400 samples (3 at 200, where a job with 80 %
# of its step in one stage read anywhere from 4x to 5x as its speedup, run to run).
SPAN_S = 8.0
FLUSH_S = 0.5  # the in-process sampler writes what it has this often
STACKS_TXT = "stacks.txt"
STACKS_JSON = "stacks.json"
MODE_FILE = "stacks-mode.json"  # in RUN_DIR: which recorder the processes should use
ENV_STACKS = "DOCTOR_STACKS"  # "in-process" skips py-spy (e.g. where ptrace is audited)
PR_SET_PTRACER = 0x59616D61
PTRACE_HINT = ("py-spy needs ptrace: run the container with --cap-add SYS_PTRACE, or set "
               "kernel.yama.ptrace_scope=0; doctor fell back to an in-process sampler")


@dataclass(frozen=True)
class StackSamples:
    """Samples of one process's main thread, running or not: stack (outermost first) -> count."""

    stacks: dict[tuple[str, ...], int]
    recorder: str
    rate_hz: float
    span_ns: tuple[int, int]
    taken: int  # samples the recorder reports (all threads, for py-spy)

    @property
    def count(self) -> int:
        return sum(self.stacks.values())


def read_stacks(proc_dir: Path) -> StackSamples | None:
    """The samples a process folder holds, or None."""
    txt = proc_dir / STACKS_TXT
    meta = read_meta(proc_dir)
    if meta is None or not txt.is_file():
        return None
    try:
        stacks = parse_raw(txt.read_text(errors="replace"), main_thread=_pid_of(proc_dir))
    except (OSError, ValueError):
        return None
    return StackSamples(stacks, str(meta.get("recorder", "?")), float(meta.get("rate_hz", RATE_HZ)),
                        (int(meta.get("start_ns", 0)), int(meta.get("end_ns", 0))),
                        int(meta.get("taken", 0)))


_THREAD = re.compile(r"^thread \((?:0x)?(?P<tid>[0-9A-Fa-f]+)\)(: .*)?$")


def parse_raw(text: str, main_thread: int | None = None) -> dict[tuple[str, ...], int]:
    """py-spy's raw format. With ``--threads`` each stack starts with ``thread (TID): NAME``:
    that frame is dropped, and only thread ``main_thread`` is kept when it is given and found.
    A thread sample with no Python frame (the interpreter is shutting down) is left out."""
    out: Counter[tuple[str, ...]] = Counter()
    by_thread: dict[int, Counter[tuple[str, ...]]] = {}
    for line in text.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = tuple(stack.split(";"))
        m = _THREAD.match(frames[0])
        if m is None:
            out[frames] += int(count)
            continue
        tid = int(m["tid"], 16) if frames[0].startswith("thread (0x") else int(m["tid"])
        counts = by_thread.setdefault(tid, Counter())
        if len(frames) > 1:
            counts[frames[1:]] += int(count)
    if not by_thread:
        return dict(out)
    if main_thread is not None and main_thread in by_thread:
        return dict(by_thread[main_thread])
    for counts in by_thread.values():
        out.update(counts)
    return dict(out)


def _pid_of(proc_dir: Path) -> int | None:
    """The pid in a process folder's name (``main-1234``, ``worker0-5678``)."""
    tail = proc_dir.name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else None


def format_raw(stacks: Counter[tuple[str, ...]]) -> str:
    return "".join(f"{';'.join(s)} {n}\n" for s, n in stacks.items())


def read_meta(proc_dir: Path) -> dict[str, Any] | None:
    """A process folder's stacks.json (recorder, rate, span, samples taken), or None."""
    try:
        meta = json.loads((proc_dir / STACKS_JSON).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def write_meta(proc_dir: Path, **meta: Any) -> None:
    _write_atomic(proc_dir / STACKS_JSON, json.dumps(meta))


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


# ---- in the job: name the tracer, and the fallback sampler ---------------------------------

def allow_tracer(parent_pid: int) -> None:
    """Under Yama ptrace_scope=1, let the doctor parent's py-spy children attach to us."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PTRACER, parent_pid, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def request_in_process_stacks(run_dir: Path, reason: str) -> None:
    (run_dir / MODE_FILE).write_text(json.dumps({"mode": "in-process", "reason": reason}))


def fallback_requested(run_dir: Path) -> bool:
    try:
        return json.loads((run_dir / MODE_FILE).read_text()).get("mode") == "in-process"
    except (OSError, ValueError):
        return False


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
            stacks[_stack(frame)] += 1
            del frame
            if taken % flush_every == 0:
                # a DataLoader worker may be ended at any time (os._exit, no atexit): keep
                # what is sampled so far on disk
                self._flush(stacks, start, taken)
            next_at += period
            time.sleep(max(0.0, next_at - time.monotonic()))
        self._flush(stacks, start, taken)

    def _flush(self, stacks: Counter[tuple[str, ...]], start: int, taken: int) -> None:
        try:
            _write_atomic(self.proc_dir / STACKS_TXT, format_raw(stacks))
            write_meta(self.proc_dir, recorder="in-process", rate_hz=self.rate_hz,
                       start_ns=start, end_ns=self.clock(), taken=taken)
        except OSError:
            pass


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
    """Starts one py-spy per process of a rank when that rank's window opens."""

    name = "stacks"

    def __init__(self, run_dir: Path, *, rate_hz: float = RATE_HZ, span_s: float = SPAN_S,
                 clock: Callable[[], int] = time.perf_counter_ns,
                 py_spy: str | None = None) -> None:
        self.run_dir = run_dir
        self.rate_hz = rate_hz
        self.span_s = span_s
        self.clock = clock
        if py_spy is None:
            py_spy = "" if os.environ.get(ENV_STACKS) == "in-process" else shutil.which("py-spy")
        self.py_spy = py_spy
        self._started: set[Path] = set()
        self._running: list[tuple[subprocess.Popen[bytes], Path, int]] = []
        missing = (f"{ENV_STACKS}=in-process" if os.environ.get(ENV_STACKS) == "in-process"
                   else "py-spy is not installed")
        self.status = ProbeStatus(True) if self.py_spy else ProbeStatus(
            False, missing, "pip install py-spy; doctor fell back to an in-process sampler")
        self.fallback_reason = "" if self.py_spy else self.status.reason
        if not self.py_spy:
            self._request_fallback(self.status.reason)
        else:  # find out now, long before the first window, whether ptrace is allowed
            threading.Thread(target=self._check_ptrace, name="doctor-ptrace-check",
                             daemon=True).start()

    def _check_ptrace(self) -> None:
        assert self.py_spy is not None
        why = ptrace_refusal(self.py_spy, os.getpid())
        if why is not None:
            self._request_fallback(f"ptrace refused ({why})")

    def check(self) -> ProbeStatus:
        return self.status

    def sample(self) -> None:
        """Called at the parent's tick: start recorders for newly opened windows, reap others."""
        self._reap()
        if self.fallback_reason:
            return
        for proc_dir in self.run_dir.glob("rank-*/main-*"):
            if proc_dir in self._started or not _window_open(proc_dir):
                continue
            self._started.add(proc_dir)
            main_pid = int(proc_dir.name.split("-")[1])
            targets = [(proc_dir, main_pid), *_worker_dirs(proc_dir.parent, main_pid)]
            for target_dir, pid in targets:
                self._spawn(target_dir, pid)

    def _spawn(self, proc_dir: Path, pid: int) -> None:
        assert self.py_spy is not None
        cmd = [self.py_spy, "record", "--pid", str(pid), "--rate", str(int(self.rate_hz)),
               "--duration", str(max(1, round(self.span_s))), "--full-filenames",
               "--idle", "--threads",
               "--format", "raw", "--output", str(proc_dir / STACKS_TXT)]
        try:
            # py-spy prints its summary ("Samples: N") on stdout, its errors on stderr
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except OSError as err:
            self._request_fallback(f"py-spy could not start: {err}")
            return
        self._running.append((proc, proc_dir, self.clock()))

    def _reap(self) -> None:
        still = []
        for proc, proc_dir, start in self._running:
            if proc.poll() is None:
                still.append((proc, proc_dir, start))
                continue
            err = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            if proc.returncode != 0 and not (proc_dir / STACKS_TXT).is_file():
                if "ermission" in err or "ptrace" in err.lower() or "EPERM" in err:
                    self._request_fallback("ptrace refused: " + _last_line(err))
                continue
            write_meta(proc_dir, recorder="py-spy", rate_hz=self.rate_hz, start_ns=start,
                       end_ns=self.clock(), taken=_samples_taken(err))
        self._running = still

    def _request_fallback(self, reason: str) -> None:
        self.fallback_reason = reason
        self.status = ProbeStatus(True, f"in-process sampler ({reason})", PTRACE_HINT)
        try:
            request_in_process_stacks(self.run_dir, reason)
        except OSError:
            pass

    def stop(self) -> None:
        for proc, _dir, _start in self._running:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)  # py-spy writes what it has on SIGINT
        deadline = time.monotonic() + 5
        for proc, _dir, _start in self._running:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
        self._reap()


def _window_open(proc_dir: Path) -> bool:
    try:
        meta = json.loads((proc_dir / "meta.json").read_text())
    except (OSError, ValueError):
        return False
    return meta.get("window", {}).get("state") in ("active", "done")


def _worker_dirs(rank_dir: Path, main_pid: int) -> list[tuple[Path, int]]:
    """Live DataLoader workers of ``main_pid``: their folders (created at their first fetch)."""
    try:
        import psutil

        children = {p.pid for p in psutil.Process(main_pid).children()}
    except Exception:  # the process may be gone; then there is nothing to sample
        return []
    out = []
    for d in rank_dir.glob("worker*-*"):
        pid = int(d.name.rsplit("-", 1)[1])
        if pid in children:
            out.append((d, pid))
    return out


def _samples_taken(stderr: str) -> int:
    marker = "Samples: "
    if marker in stderr:
        tail = stderr.rsplit(marker, 1)[1].split()[0]
        if tail.isdigit():
            return int(tail)
    return 0


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:200] if lines else "no message"


def start_fallback_sampler(proc_dir: Path) -> None:
    """Sample the calling thread of this process (the training or worker loop)."""
    sampler = InProcessSampler(proc_dir, threading.get_ident())
    sampler.start()


def ptrace_refusal(py_spy: str, parent_pid: int, timeout: float = 10.0) -> str | None:
    """Try py-spy on a throwaway process set up as the job's are; None when it works, else why.

    The job's processes name the doctor parent as their tracer (PR_SET_PTRACER), so a refusal
    here means the same refusal there: a container without SYS_PTRACE, or Yama scope 2-3.
    """
    target = subprocess.Popen(
        [sys.executable, "-c",
         "import ctypes, sys, time\n"
         f"ctypes.CDLL(None).prctl({PR_SET_PTRACER}, {parent_pid}, 0, 0, 0)\n"
         "sys.stdout.write('ready\\n'); sys.stdout.flush(); time.sleep(30)\n"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert target.stdout is not None
        target.stdout.readline()
        out = subprocess.run([py_spy, "dump", "--nonblocking", "--pid", str(target.pid)],
                             capture_output=True, text=True, timeout=timeout)
        if out.returncode == 0:
            return None
        return _last_line(out.stderr or out.stdout)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"py-spy did not answer: {err}"
    finally:
        target.kill()
        target.wait()


__all__ = ["InProcessSampler", "PySpyRecorder", "StackSamples", "allow_tracer",
           "fallback_requested", "parse_raw", "ptrace_refusal", "read_stacks",
           "request_in_process_stacks", "start_fallback_sampler"]
