"""What the training thread did in each step: on a core, waiting for one, or blocked; and the
time stack sampling stopped it, measured and taken out.

The ``doctor run`` parent reads each process's main thread from /proc/PID/schedstat at every
tick (doctor.probes.host: ``on_cpu_s``, ``run_delay_s``, cumulative). Interpolated at a step's
start and end, they split its wall time into running (on a core), runnable (waiting for a core)
and blocked (neither: sleeping in a read, a lock, a wait for a worker, or stopped). A step
shorter than the ticks gets the mean of the ticks around it; a long one (a stall) its own.

py-spy in blocking mode stops every thread of the process for each sample: a stopped thread
is neither running nor runnable, so the pause shows as blocked time, and only while sampling.
It is measured, not assumed: the sampled steps' median blocked seconds per second on a core
against the other steps' (medians: one stall inside the sampling span does not count as the
sampler's; per second on a core: a pause lengthens a step only where it stops a thread that
would have run), and that much of each sampled step's time on a core is taken out of its blocked
time (``sampler_s``), so the sampled steps count in the shares as the job would have run them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from doctor.probes.stack_plan import PAUSE_PER_BUSY_THREAD_S, PAUSE_PER_IDLE_THREAD_S
from doctor.store.rundata import Process, RunData

NS = 1e-9
#: Fewer steps than this on either side of the sampling span, or steps outside it that span
#: fewer than MIN_TICKS of the parent's samples: the pause is not measured but modelled.
MIN_STEPS_TO_MEASURE = 3
MIN_TICKS = 2.0
THREAD_COLUMNS = ("running_s", "runnable_s", "blocked_s", "sampler_s")
SAMPLER_MEASURED = "sampler_measured"  # step table flag: the pause was measured, not modelled


@dataclass(frozen=True)
class ThreadTimes:
    """Per step (seconds): the training thread on a core, waiting for one, blocked (the
    sampler's pause included); NaN where the parent's samples do not cover the step."""

    running: np.ndarray
    runnable: np.ndarray
    blocked: np.ndarray
    tick_s: float = 0.0  # the parent's median time between samples

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
    return ThreadTimes(np.where(covered, running, nan), np.where(covered, runnable, nan),
                       np.where(covered, blocked, nan), float(np.median(np.diff(t))))


def sampler_pause(times: ThreadTimes, wall: np.ndarray, under_sampler: np.ndarray,
                  counted: np.ndarray, modelled: float = 0.0) -> tuple[np.ndarray, bool]:
    """Per step, the seconds the stack sampler stopped the thread, and whether that was
    measured. A pause lengthens a step where it stops a thread that would have run (a thread
    blocked in a read waits the same, stopped or not), so it is counted per second on a core:
    the excess of the sampled steps' median blocked seconds per second on a core over the
    other ``counted`` steps' (never below zero), times each step's time on a core under the
    sampler (``under_sampler``: its seconds under it), never more than the step's blocked
    time. Where too few steps ran outside the sampling to say, ``modelled`` (the pause per
    second on a core the sampler's plan expects) stands in."""
    on_core = np.nan_to_num(times.running + times.runnable)
    ratio = np.where(on_core > 0, times.blocked / np.where(on_core > 0, on_core, 1.0), np.nan)
    usable = counted & times.known & (on_core > 0)
    sampled = usable & (under_sampler > 0)
    others = usable & (under_sampler <= 0)
    measured = sampled.sum() >= MIN_STEPS_TO_MEASURE and \
        others.sum() >= MIN_STEPS_TO_MEASURE and \
        float(wall[others].sum()) >= MIN_TICKS * times.tick_s
    per_core_s = float(np.median(ratio[sampled])) - float(np.median(ratio[others])) \
        if measured else modelled
    if per_core_s <= 0:
        return np.zeros(len(wall)), measured
    share = np.where(wall > 0, np.minimum(under_sampler / np.where(wall > 0, wall, 1.0), 1.0),
                     0.0)
    pause = np.minimum(per_core_s * on_core * share, np.nan_to_num(times.blocked))
    return np.where(times.known, np.maximum(pause, 0.0), 0.0), measured


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
                             "count in the shares; its pauses were not measurable in them "
                             "(the training thread was no more often stopped than in the "
                             "other steps).")
            continue
        wall = float(sampled["wall_s"].sum())
        how = ("measured: its blocked time per second on a core beyond the other steps', from "
               "/proc schedstat" if sampled["sampler_measured"].any() else
               "too few steps ran outside the sampling to measure it: py-spy's pause per thread "
               "times its rate, within the thread's blocked time")
        notes.append(f"Rank {rank}: the {len(sampled)} steps during stack sampling count "
                     f"in the shares, less the {taken:.2f} s ({taken / max(wall, 1e-12):.0%} of "
                     f"their time) the sampler's pauses stopped the training thread ({how}).")
    return notes


__all__ = ["SAMPLER_MEASURED", "THREAD_COLUMNS", "ThreadTimes", "modelled_pause", "sampler_note",
           "sampler_pause", "thread_times"]
