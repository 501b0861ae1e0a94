"""Cores the job's processes used, and the training process's wait for a core.

From the parent's samples of each process (doctor.store.samples): CPU seconds, the CPU seconds
of its communication threads, and the kernel's run-queue delay (``/proc/PID/schedstat``: time
runnable but not running), as rates over the span of the analysed steps. With DataLoader
workers or communication threads on few cores, the training thread waits for cores they hold;
that wait is their cost too (the ledger counts it as input, or as communication).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from doctor.analyse.steps import RankSteps

MIN_CONTENTION = 0.02  # of the step's time outside the wait, below which it is noise
Span = tuple[float, float]


def analysed_span(steps: pd.DataFrame) -> Span | None:
    """(first start, last end) of the analysed steps, seconds from the run's start."""
    if steps.empty:
        return None
    return float(steps["start_s"].min()), float((steps["start_s"] + steps["wall_s"]).max())


def within(frame: pd.DataFrame, span: Span | None) -> pd.DataFrame:
    """The host or machine samples taken during ``span`` (seconds, the ledger's clock)."""
    if span is None or frame.empty or "t_s" not in frame:
        return frame
    return frame[(frame["t_s"] >= span[0]) & (frame["t_s"] <= span[1])]


INPUT, COMMUNICATION = "input", "communication"


def core_contention(host: pd.DataFrame, system: pd.DataFrame, steps: pd.DataFrame,
                    workers: dict[int, list[int]], ranks: dict[int, RankSteps],
                    span: Span | None) -> dict[int, dict[str, float]]:
    """Per rank, the fraction of its analysed steps' time outside the input wait that the
    training thread spent runnable but without a core (the kernel's run-queue delay), shared
    out among what held the cores in proportion to the CPU each burnt: its DataLoader workers
    (``workers``: rank -> their pids, on the rank's node) as ``input``, and the communication
    threads of every training process on its node (gloo, NCCL, MPI: the host probe's
    ``comm_cpu_s``) as ``communication``. Whatever else ran (other ranks' training threads,
    other jobs) keeps its part: it is neither's cost."""
    if span is None or host.empty or host["run_delay_s"].isna().all():
        return {}
    out: dict[int, dict[str, float]] = {}
    for rank, main in ranks.items():
        mine = steps[(steps["rank"] == rank) & steps["analyzed"]]
        delayed = per_wall(host, [(main.node, main.pid)], span, "run_delay_s")
        if delayed is None or mine.empty:
            continue
        rest = 1.0 - float(mine["wait_s"].sum()) / max(float(mine["wall_s"].sum()), 1e-12)
        if rest <= 0:
            continue
        of_rest = min(1.0, delayed / rest)
        node = [m for m in ranks.values() if m.node == main.node]
        loading = cores_used(host, [(main.node, p) for p in workers.get(rank, [])], span,
                             total=True) or 0.0
        comm = (per_wall(host, [(m.node, m.pid) for m in node], span, "comm_cpu_s", total=True)
                if "comm_cpu_s" in host else None) or 0.0
        own_comm = (per_wall(host, [(main.node, main.pid)], span, "comm_cpu_s")
                    if "comm_cpu_s" in host else None) or 0.0
        training = max((cores_used(host, [(main.node, main.pid)], span) or 0.0) - own_comm, 0.0)
        machine = within(system[system["node"] == main.node], span)
        busy = float(machine["busy_cores"].median()) if not machine.empty \
            else loading + comm + training
        competing = max(busy - training, loading + comm, 1e-9)
        shares = {INPUT: of_rest * loading / competing,
                  COMMUNICATION: of_rest * comm / competing}
        kept = {k: v for k, v in shares.items() if v >= MIN_CONTENTION}
        if kept:
            out[rank] = kept
    return out


def cores_used(host: pd.DataFrame, procs: list[tuple[int, int]], span: Span | None,
               total: bool = False) -> float | None:
    """Cores the processes ((node, pid) pairs) kept busy (CPU seconds over wall seconds) during
    ``span``: the mean per process, or their sum."""
    return per_wall(host, procs, span, "cpu_s", total)


def per_wall(host: pd.DataFrame, procs: list[tuple[int, int]], span: Span | None, counter: str,
             total: bool = False) -> float | None:
    """Seconds a per-process counter (``cpu_s``, ``run_delay_s``) grew per wall second over
    ``span``, for the processes ((node, pid) pairs): the mean per process, or their sum; None
    without two samples of one."""
    if host.empty or not procs:
        return None
    keys = host["node"].to_numpy(np.int64) * (1 << 32) + host["pid"].to_numpy(np.int64)
    mask = np.isin(keys, [int(n) * (1 << 32) + int(p) for n, p in procs])
    rows = within(host[mask].dropna(subset=[counter]), span)
    per_pid = []
    for _key, g in rows.groupby(["node", "pid"]):
        wall = float(g["t_s"].max() - g["t_s"].min())
        if wall > 0:
            per_pid.append(float(g[counter].max() - g[counter].min()) / wall)
    if not per_pid:
        return None
    return sum(per_pid) if total else sum(per_pid) / len(per_pid)

