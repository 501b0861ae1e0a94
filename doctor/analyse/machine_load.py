"""Other processes taking the machine's cores, as a cause of slow steps.

The ``doctor run`` parent samples the job's processes and the machine twice a second
(doctor.store.samples): each tick says how many cores the machine kept busy since the last one
(``busy_cores``, from /proc/stat) and how much CPU each process of the job burnt. What the
machine burnt beyond the job is other processes' (another job, a build, an indexer). A tick in
which they kept MIN_OTHER_CORES or more busy is an interval of this cause, weighted by the share
of the cores they took: a step that ran then was slowed by the machine, not by the job. Where
the kernel keeps the training thread's run-queue delay (/proc/PID/schedstat, sampled with the
job's processes), a tick counts only if the thread waited for a core in it: other processes on
cores the job may not use (a container's cpuset) take nothing from it. The parent also reads
every process's CPU time every few seconds (doctor.probes.others): the busiest outside the job
are named, with their cores, beside the ticks they overlap.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from doctor.analyse.causes import Cause, Intervals
from doctor.analyse.steps import WINDOW, RankSteps
from doctor.store.rundata import RunData
from doctor.verdict import Fix

MACHINE = "other_processes"
MIN_OTHER_CORES = 0.5  # other processes kept at least this many cores busy in a tick...
MIN_WAIT = 0.05  # ...and the training thread waited this share of it for a core, where known

MACHINE_FIX = Fix(
    title="Give the job the machine (or cores) to itself",
    why="Other processes kept cores busy while these steps ran: the job waited for the "
        "machine, not for its own work. Run it where nothing else runs, or pin each to its "
        "own cores.",
    code="taskset -c 0-7 python train.py        # the job on cores 0-7\n"
         "taskset -c 8-15 ./other_work          # the rest elsewhere")


def other_load(host: pd.DataFrame, system: pd.DataFrame, node: int = 0,
               waited: pd.Series | None = None, others: pd.DataFrame | None = None
               ) -> Intervals | None:
    """The ticks of ``node`` in which other processes than the job's kept MIN_OTHER_CORES or
    more busy: each an interval (the tick's span), weighted by their share of the cores; None
    without any. ``waited``: the training thread's run-queue delay per wall second at each tick
    (by ``t_s``): where it is known, a tick counts only if the thread waited MIN_WAIT of it for
    a core (other processes on cores the job may not use take nothing from it). ``others``:
    the processes outside the job seen taking cores (doctor.probes.others), named in the
    words of the ticks they overlap."""
    machine = system[system["node"] == node].sort_values("t_s") if not system.empty else system
    if machine.empty or "busy_cores" not in machine or len(machine) < 2:
        return None
    t = machine["t_s"].to_numpy(np.float64)
    mine = host[host["node"] == node] if not host.empty else host
    job = (mine["cpu_pct"].fillna(0.0) / 100.0).groupby(mine["t_s"]).sum() \
        if not mine.empty else pd.Series(dtype=float)
    job_cores = job.reindex(t, fill_value=0.0).to_numpy(np.float64)
    cores = machine["cores"].to_numpy(np.float64)
    load = machine["busy_cores"].to_numpy(np.float64) - job_cores
    wait = waited.reindex(t).to_numpy(np.float64) if waited is not None else np.full(len(t),
                                                                                      np.nan)
    load[_job_changed(mine, t)] = np.nan  # the job's own, unmeasured: not other processes'
    loaded = (load >= MIN_OTHER_CORES) & np.isfinite(load) & ~(wait < MIN_WAIT)
    keep = np.flatnonzero(loaded)
    keep = keep[keep > 0]  # a tick's span starts at the one before
    if not len(keep):
        return None
    weight = np.clip(load[keep] / np.maximum(cores[keep], 1.0), 0.0, 1.0)
    seen = others_of(others, node)
    words = [f"other processes kept {o:.1f} of {c:.0f} cores busy" + _named(seen, a, b)
             for o, c, a, b in zip(load[keep], cores[keep], t[keep - 1], t[keep], strict=True)]
    return Intervals.of(t[keep - 1], t[keep], weight, words)


def _job_changed(mine: pd.DataFrame, t: np.ndarray) -> np.ndarray:
    """The ticks in which a process of the job started or ended: its CPU there is not in the
    samples (a process's first sample has no CPU yet, and one that ended took its last
    interval's with it), so what the machine burnt beyond the samples may be the job's own
    (DataLoader workers starting at each epoch, not other processes)."""
    changed = np.zeros(len(t), dtype=bool)
    if mine.empty or "pid" not in mine or len(t) < 2:
        return changed
    spans = mine.groupby("pid")["t_s"].agg(["min", "max"])
    first = spans["min"].to_numpy(np.float64)
    last = spans["max"].to_numpy(np.float64)
    started = np.searchsorted(t, first[first > t[0]], side="left")
    ended = np.searchsorted(t, last[last < t[-1]], side="right")
    changed[started[started < len(t)]] = True
    changed[ended[ended < len(t)]] = True
    return changed


def others_of(others: pd.DataFrame | None, node: int) -> pd.DataFrame | None:
    if others is None or others.empty:
        return None
    return others[others["node"] == node]


def _named(seen: pd.DataFrame | None, t0: float, t1: float, most: int = 3) -> str:
    """": name (pid P) N cores, ..." of the busiest processes seen taking cores around
    [t0, t1] ('' where none were seen)."""
    if seen is None or seen.empty:
        return ""
    rows = seen[(seen["t0_s"] < t1) & (seen["t1_s"] > t0)]
    if rows.empty:
        return ""
    top = rows.sort_values("cores", ascending=False).drop_duplicates("pid").head(most)
    return ": " + ", ".join(f"{n} (pid {int(p)}) {c:.1f} cores"
                            for n, p, c in zip(top["name"], top["pid"], top["cores"],
                                               strict=True))


def run_delay_rate(host: pd.DataFrame, node: int, pid: int) -> pd.Series | None:
    """The process's run-queue delay per wall second over each tick, by the tick's ``t_s``;
    None where the kernel does not keep it."""
    if host.empty or "run_delay_s" not in host:
        return None
    rows = host[(host["node"] == node) & (host["pid"] == pid)].sort_values("t_s")
    if rows["run_delay_s"].isna().all():
        return None
    rate = rows["run_delay_s"].diff() / rows["t_s"].diff()
    return pd.Series(rate.to_numpy(np.float64), index=rows["t_s"].to_numpy(np.float64))


def machine_cause(run: RunData, ranks: dict[int, RankSteps]) -> Cause | None:
    """Other processes' load on each rank's node as a Cause (None: none seen, or no samples)."""
    intervals = {}
    for rank, r in ranks.items():
        if r.kind == WINDOW:
            continue
        load = other_load(run.host, run.system, r.node, run_delay_rate(run.host, r.node, r.pid),
                          run.others)
        if load is not None:
            intervals[rank] = load
    if not intervals:
        return None
    return Cause(MACHINE, "other processes on the machine's cores", intervals, MACHINE_FIX,
                 machine=True)


__all__ = ["MACHINE", "MACHINE_FIX", "machine_cause", "other_load"]
