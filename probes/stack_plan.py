"""How py-spy samples one process: the plan that keeps its pauses within budget.

py-spy's blocking mode (doctor's default: reading a running interpreter's stack without pausing
it loses tight Python loops) stops the whole process for each sample. Each thread lengthens the
pause, and a busy one also loses its work meanwhile, so a process with many threads is sampled
at a lower rate for longer (as many samples), or, past that, without pausing it. The parent
counts each process's threads as its window opens (thread_counts) and asks sampling_plan.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

RATE_HZ = 50
# How long each process is sampled: ~400 samples. A stage's share of loading is a count of
# samples, with a binomial error: about 2 points at 400 samples (3 at 200, where a job with 80 %
# of its step in one stage read anywhere from 4x to 5x as its speedup, run to run).
SPAN_S = 8.0
ENV_STACKS = "DOCTOR_STACKS"  # "in-process" skips py-spy (e.g. where ptrace is audited)
BLOCKING, NONBLOCKING = "blocking", "nonblocking"  # DOCTOR_STACKS: py-spy's mode, whatever the plan
#: py-spy's blocking mode stops every thread of the process for each sample and reads every
#: Python thread's stack while it is stopped: each thread, busy or idle, lengthens the pause, and
#: a busy one also loses its work meanwhile. Measured here (steps sampled against steps not,
#: medians of 3-4 rounds; the machine's own noise about 5 %, single rounds up to 25 %):
#: bench/stack_cost.py, 32 busy intra-op threads 1.22x at 50 Hz, 1.00x at 20 Hz, one thread
#: 0.97x; bench/window_threads.py under doctor run, 64 idle Python threads 1.36x at 50 Hz and
#: 1.09x at the 15 Hz this plan gives them. Per sample, about:
PAUSE_PER_BUSY_THREAD_S = 1.4e-4
PAUSE_PER_IDLE_THREAD_S = 1.0e-4
PAUSE_BUDGET = 0.10  # of the sampled process's time: steps in the window at most ~1.1x slower
MIN_BLOCKING_HZ = 10.0  # below it, too few samples even in MAX_SPAN_S: read without pausing
MAX_SPAN_S = 20.0  # a slower rate samples longer, for as many samples, up to this
BUSY_PROBE_S = 0.1  # how long the parent watches the threads' CPU to count the busy ones


@dataclass(frozen=True)
class SamplingPlan:
    """How one process is sampled: py-spy pausing it (``blocking``) or not, at what rate."""

    blocking: bool
    rate_hz: float
    span_s: float
    busy_threads: int | None = None  # threads that were running when its window opened
    threads: int | None = None  # all its threads then
    forced: bool = False  # DOCTOR_STACKS chose the mode

    @property
    def recorder(self) -> str:
        mode = "py-spy" if self.blocking else "py-spy nonblocking"
        return f"{mode} ({ENV_STACKS})" if self.forced else mode


Threads = tuple[int, int]  # (busy, all) threads of a process


def sampling_plan(threads: Threads | None, rate_hz: float = RATE_HZ, span_s: float = SPAN_S,
                  forced: str | None = None) -> SamplingPlan:
    """Blocking at ``rate_hz`` while its pauses fit the budget; else blocking at a lower rate
    for longer (as many samples, down to MIN_BLOCKING_HZ); else without pausing the process
    (free of pauses, but a tight Python loop may be missed: py-spy reads a moving stack).
    ``forced`` (BLOCKING or NONBLOCKING, from DOCTOR_STACKS) keeps ``rate_hz`` in that mode."""
    busy, total = threads if threads is not None else (None, None)
    if forced in (BLOCKING, NONBLOCKING):
        return SamplingPlan(forced == BLOCKING, rate_hz, span_s, busy, total, forced=True)
    if busy is None or total is None:  # not counted: the default
        return SamplingPlan(True, rate_hz, span_s)
    pause = busy * PAUSE_PER_BUSY_THREAD_S + max(total - busy, 0) * PAUSE_PER_IDLE_THREAD_S
    if pause * rate_hz <= PAUSE_BUDGET:
        return SamplingPlan(True, rate_hz, span_s, busy, total)
    rate = PAUSE_BUDGET / pause
    if rate >= MIN_BLOCKING_HZ:
        return SamplingPlan(True, rate, min(span_s * rate_hz / rate, MAX_SPAN_S), busy, total)
    return SamplingPlan(False, rate_hz, span_s, busy, total)


def thread_counts(pids: list[int], interval_s: float = BUSY_PROBE_S
                  ) -> dict[int, Threads | None]:
    """For each of ``pids``: (its threads that ran at least 5 % of ``interval_s``, all its
    threads), watched all at once; None where the process cannot be read. CPU time per thread
    from /proc/PID/task/TID/schedstat (nanoseconds), else psutil (clock ticks)."""
    before = {pid: _thread_cpu(pid) for pid in pids}
    time.sleep(interval_s)
    out: dict[int, Threads | None] = {}
    for pid in pids:
        first, then = before[pid], _thread_cpu(pid)
        if first is None or then is None:
            out[pid] = None
            continue
        busy = sum(1 for tid, t in then.items() if t - first.get(tid, t) >= 0.05 * interval_s)
        out[pid] = (max(1, busy), len(then))
    return out


def _thread_cpu(pid: int) -> dict[int, float] | None:
    """CPU seconds of each thread of ``pid`` (None: gone, or not ours to read)."""
    tasks = Path(f"/proc/{pid}/task")
    if tasks.is_dir():
        out: dict[int, float] = {}
        try:
            for task in tasks.iterdir():
                try:
                    out[int(task.name)] = int((task / "schedstat").read_text().split()[0]) / 1e9
                except (OSError, ValueError, IndexError):
                    continue  # a thread that ended as it was read
        except OSError:
            return None
        if out:
            return out
    try:
        import psutil

        return {t.id: t.user_time + t.system_time for t in psutil.Process(pid).threads()}
    except Exception:  # gone, or not ours to read: None says so (the plan then counts none)
        return None
