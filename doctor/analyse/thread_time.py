"""What the training thread did in each step: on a core, waiting for one, or blocked; and the
time stack sampling stopped it, measured and taken out.

The ``doctor run`` parent reads each process's main thread from /proc/PID/schedstat at every
tick (doctor.probes.host: ``on_cpu_s``, ``run_delay_s``, cumulative). Interpolated at a step's
start and end, they split its wall time into running (on a core), runnable (waiting for a core)
and blocked (neither: sleeping in a read, a lock, a wait for a worker, or stopped). A step
shorter than the ticks gets the mean of the ticks around it; a long one (a stall) its own.

py-spy in blocking mode stops every thread of the process for each sample: a stopped thread
is neither running nor runnable, so the pause shows as blocked time, and only while sampling.
It is measured, not assumed, between the parent's ticks where the thread was mostly on a core:
their median blocked seconds per second on a core under the sampler, less that away from it
(per second on a core: a pause lengthens a step only where it stops a thread that would have
run; mostly on a core: an interval inside a stall, or of a thread mostly waiting for its
input, says nothing of the pause; medians: a few odd intervals do not move it). Where too few
such intervals ran on either side (a short run, sampled nearly throughout), the stack plan's
pause per thread times the rate stands in (doctor.probes.stack_plan). That much of each
sampled step's time on a core is taken out of its blocked time (``sampler_s``), so the sampled
steps count in the shares as the job would have run them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from doctor.probes.stack_plan import PAUSE_PER_BUSY_THREAD_S, PAUSE_PER_IDLE_THREAD_S
from doctor.store.process_rows import Process
from doctor.store.rundata import RunData

#: Fewer intervals between the parent's ticks than this, with the thread mostly on a core, on
#: either side of the sampling span: the pause is not measured but modelled.
MIN_INTERVALS = 2
MOSTLY_ON_CORE = 0.5
THREAD_COLUMNS = ("running_s", "runnable_s", "blocked_s", "sampler_s")
SAMPLER_MEASURED = "sampler_measured"  # step table flag: the pause was measured, not modelled


@dataclass(frozen=True)
class ThreadTimes:
    """Per step (seconds): the training thread on a core, waiting for one, blocked (the
    sampler's pause included); NaN where the parent's samples do not cover the step. And the
    parent's ticks themselves: their times, and per interval between two, the thread's seconds
    on a core (running or runnable) and blocked."""

    running: np.ndarray
    runnable: np.ndarray
    blocked: np.ndarray
    ticks: np.ndarray
    tick_on_core: np.ndarray
    tick_blocked: np.ndarray

    @property
    def known(self) -> np.ndarray:
        return ~np.isnan(self.running)


def thread_times(host: pd.DataFrame, node: int, pid: int, starts_s: np.ndarray,
                 ends_s: np.ndarray) -> ThreadTimes | None:
    """The split of each step [starts_s, ends_s) (seconds on the host samples' clock) of the
    process ``pid`` on ``node``; None without two samples of its main thread's schedstat."""
    if host.empty or "on_cpu_s" not in host:
        return None
    rows = host[(host["node"] == node) & (host["pid"] == pid)]
    rows = rows.dropna(subset=["on_cpu_s", "run_delay_s"]).sort_values("t_s")
    if len(rows) < 2:
        return None
    t = rows["t_s"].to_numpy(np.float64)
    on_cpu = np.maximum.accumulate(rows["on_cpu_s"].to_numpy(np.float64))
    delay = np.maximum.accumulate(rows["run_delay_s"].to_numpy(np.float64))
    wall = np.maximum(ends_s - starts_s, 0.0)
    covered = (starts_s >= t[0]) & (ends_s <= t[-1])
    running = np.interp(ends_s, t, on_cpu) - np.interp(starts_s, t, on_cpu)
    runnable = np.interp(ends_s, t, delay) - np.interp(starts_s, t, delay)
    # one thread is on a core or waiting for one at most all of the time
    running = np.minimum(running, wall)
    runnable = np.minimum(runnable, wall - running)
    blocked = wall - running - runnable
    nan = np.full(len(wall), np.nan)
    dt = np.diff(t)
    on_core = np.minimum(np.diff(on_cpu) + np.diff(delay), dt)
    return ThreadTimes(np.where(covered, running, nan), np.where(covered, runnable, nan),
                       np.where(covered, blocked, nan), t, on_core, dt - on_core)


def sampler_pause(times: ThreadTimes, starts_s: np.ndarray, ends_s: np.ndarray,
                  sampler_s: tuple[float, float] | None, counted: np.ndarray,
                  modelled: float = 0.0) -> tuple[np.ndarray, bool]:
    """Per step, the seconds the stack sampler (over ``sampler_s``, seconds on the steps'
    clock) stopped the thread, and whether that was measured. A pause lengthens a step where
    it stops a thread that would have run (a thread blocked in a read waits the same, stopped
    or not), so it is counted per second on a core. It is measured between the parent's ticks
    where the thread was mostly on a core (a stall, or a step mostly blocked, says nothing of
    the pause): the median blocked seconds per second on a core of those intervals under the
    sampler, less that of those among ``counted`` steps away from it (never below zero). Where
    either side has fewer than MIN_INTERVALS, ``modelled`` (the pause per second on a core the
    sampler's plan expects) stands in. Each step loses that rate times its time on a core
    under the sampler, never more than its blocked time."""
    n = len(starts_s)
    if sampler_s is None:
        return np.zeros(n), False
    wall = np.maximum(ends_s - starts_s, 0.0)
    t0, t1 = times.ticks[:-1], times.ticks[1:]
    dt = t1 - t0
    busy = times.tick_on_core >= MOSTLY_ON_CORE * dt
    ratio = times.tick_blocked / np.maximum(times.tick_on_core, 1e-12)
    inside = busy & (t0 >= sampler_s[0]) & (t1 <= sampler_s[1])
    away = busy & ((t1 <= sampler_s[0]) | (t0 >= sampler_s[1])) & \
        _among(t0, t1, starts_s, ends_s, counted)
    measured = int(inside.sum()) >= MIN_INTERVALS and int(away.sum()) >= MIN_INTERVALS
    per_core_s = float(np.median(ratio[inside]) - np.median(ratio[away])) if measured \
        else modelled
    if per_core_s <= 0:
        return np.zeros(n), measured
    under = np.clip(np.minimum(ends_s, sampler_s[1]) - np.maximum(starts_s, sampler_s[0]),
                    0.0, None)
    share = np.where(wall > 0, np.minimum(under / np.where(wall > 0, wall, 1.0), 1.0), 0.0)
    on_core = np.nan_to_num(times.running + times.runnable)
    pause = np.minimum(per_core_s * on_core * share, np.nan_to_num(times.blocked))
    return np.where(times.known, np.maximum(pause, 0.0), 0.0), measured


def _among(t0: np.ndarray, t1: np.ndarray, starts: np.ndarray, ends: np.ndarray,
           counted: np.ndarray) -> np.ndarray:
    """Per interval [t0, t1), whether steps cover it and every step it overlaps is counted
    (``starts`` sorted, the steps one after another)."""
    first = np.searchsorted(ends, t0, side="right")  # the first step ending after t0
    stop = np.searchsorted(starts, t1, side="left")  # past the last step starting before t1
    left_out = np.concatenate([[0], np.cumsum(~counted)])
    covered = (t0 >= starts[0]) & (t1 <= ends[-1]) if len(starts) else np.zeros(len(t0), bool)
    return covered & (stop > first) & (left_out[np.minimum(stop, len(counted))]
                                       - left_out[np.minimum(first, len(counted))] == 0)


def modelled_pause(run: RunData, process: Process) -> float:
    """The pause per second on a core py-spy's blocking mode is expected to cost the process
    (its threads' pause per sample, doctor.probes.stack_plan, times the rate); 0 for a
    recorder that does not pause it, or threads not counted."""
    spans = run.rows("stack_spans", process)
    if spans.empty or "busy_threads" not in spans:
        return 0.0
    row = spans.iloc[0]
    busy, total = float(row["busy_threads"]), float(row["threads"])
    if str(row["recorder"]).split(" (")[0] != "py-spy" or not np.isfinite(busy) \
            or not np.isfinite(total):
        return 0.0
    per_sample = busy * PAUSE_PER_BUSY_THREAD_S + max(total - busy, 0.0) * \
        PAUSE_PER_IDLE_THREAD_S
    return per_sample * float(row["rate_hz"])


def sampler_note(table: pd.DataFrame) -> list[str]:
    """What was taken out of the steps stack sampling overlapped, per rank that had any."""
    if table.empty or "sampler_s" not in table:
        return []
    notes = []
    for _key, rows in table.groupby("rank", sort=True):
        rank = int(rows["rank"].iloc[0])
        sampled = rows[rows["sampled"] & rows["analyzed"]]
        taken = float(sampled["sampler_s"].sum())
        if sampled.empty:
            continue
        if taken <= 0:
            if sampled["blocked_s"].notna().any():
                notes.append(f"Rank {rank}: the {len(sampled)} steps during stack sampling "
                             "count in the shares, whole: the training thread was blocked no "
                             "more under the sampler than away from it.")
            continue
        wall = float(sampled["wall_s"].sum())
        how = ("measured from /proc schedstat: the thread's blocked time per second on a core "
               "under the sampler beyond that away from it"
               if sampled["sampler_measured"].any() else
               "too few steps ran outside the sampling to measure it: py-spy's pause per thread "
               "times its rate, within the thread's blocked time")
        notes.append(f"Rank {rank}: the {len(sampled)} steps during stack sampling count "
                     f"in the shares, less the {taken:.2f} s ({taken / max(wall, 1e-12):.0%} of "
                     f"their time) the sampler's pauses stopped the training thread ({how}).")
    return notes


__all__ = ["SAMPLER_MEASURED", "THREAD_COLUMNS", "ThreadTimes", "modelled_pause", "sampler_note",
           "sampler_pause", "thread_times"]
