"""Host contention: more runnable threads than cores.

On small machines this alone can cost several times: torch's intra-op threads in each process,
DataLoader workers and other load on the machine all compete for the same cores, and OpenMP
threads spin while they wait for each other. Evidence comes from the parent's samples of the
machine's runnable-thread count (/proc/stat procs_running) and of the job's own CPU use.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from doctor.analyse.evidence import Evidence
from doctor.rules.base import RuleSkipped, rule
from doctor.verdict import Finding, Fix

OVERSUBSCRIBED = 1.5  # runnable threads per core, sustained, that we call contention
CPU_BOUND = 0.5  # cores per training process the job must keep busy for freed cores to help
FIND_OTHER_LOAD = ("# find them: top -o %CPU (or: ps -eo pid,pcpu,comm --sort=-pcpu | head)\n"
                   "# then stop them, move them to other cores (taskset), or renice them")


@rule("host.contention", needs=("system",))
def host_contention(ev: Evidence) -> list[Finding]:
    system = ev.system
    assert system is not None
    cores = int(ev.job.cores or system["cores"].max())
    runnable = system["runnable"].to_numpy(dtype=float) - 1.0  # less the sampler reading it
    runnable = runnable[np.isfinite(runnable)]
    if len(runnable) < 4:
        raise RuleSkipped("fewer than 4 machine samples")
    per_core = float(np.median(runnable)) / cores
    if per_core < OVERSUBSCRIBED:
        return []
    busy = float(np.nanmedian(system["busy_cores"]))
    job_cores = _job_cores(ev)
    other_cores = other_load_cores(ev)
    threads = ev.job.torch_threads
    procs = max(1, ev.job.ranks_here)
    workers = ev.job.worker_processes
    evidence: dict[str, Any] = {
        "cores": cores, "runnable_threads_median": float(np.median(runnable)),
        "runnable_per_core": per_core, "busy_cores_median": busy,
        "job_cores_used": job_cores, "other_load_cores": other_cores,
        "torch_threads_per_process": threads, "training_processes": procs,
        "dataloader_workers": workers,
    }
    fixes: list[Fix] = []
    speedup = None
    want = max(1, cores // (procs + workers)) if workers else max(1, cores // procs)
    if threads and threads * procs + workers > cores:
        fixes.append(set_threads(
            f"{procs} process(es) x {threads} torch threads + {workers} workers on {cores} "
            f"cores: use {want} thread(s) per process",
            "Threads beyond the cores wait for each other; fewer threads run faster.", want,
            env=True))
    if other_cores is not None and other_cores >= 0.5:
        speedup = _freed_cores_speedup(ev, cores, job_cores, other_cores, procs)
        fixes.append(Fix(
            title=f"Other processes keep {other_cores:.1f} of {cores} cores busy",
            why="The job shares the machine: stop the other load, or give the job its own "
                "cores.",
            code=FIND_OTHER_LOAD,
        ))
    if not fixes and threads is not None and threads <= want:
        fixes.append(Fix(  # the job's own threads fit: the runnable threads are someone else's
            title=f"Find what else runs: {float(np.median(runnable)):.0f} runnable threads on "
                  f"{cores} cores, the job's at {threads} thread(s) per process",
            why="The job's own processes and threads fit the cores; the other runnable "
                "threads belong to other work on the machine.",
            code=FIND_OTHER_LOAD))
    elif not fixes:
        fixes.append(set_threads(
            f"Keep runnable threads at or below {cores}",
            "The machine had more runnable threads than cores for most of the run.", want))
    return [Finding(
        id="host.contention", category="compute", severity="warning",
        title=f"{per_core:.1f} runnable threads per core: the job competes for the CPU",
        evidence=evidence, fixes=tuple(fixes), estimated_speedup=speedup,
    )]


def _freed_cores_speedup(ev: Evidence, cores: int, job_cores: float | None, other: float,
                         procs: int) -> float | None:
    """What the job gains if the other load's cores were its own: the cores it could use over
    those it used, on its compute share only (Amdahl); None where the job is not CPU-bound (it
    kept under CPU_BOUND of a core busy per training process) or its compute is unknown."""
    ledger = ev.ledger
    if not job_cores or job_cores < CPU_BOUND * procs or ledger is None or ledger.empty:
        return None
    wall = float(ledger["wall_s"].sum())
    share = float(ledger["compute"].sum()) / wall if wall > 0 and "compute" in ledger else 0.0
    ratio = min(float(cores), job_cores + other) / job_cores
    return 1.0 / ((1.0 - share) + share / ratio) if share > 0 and ratio > 1 else None


def set_threads(title: str, why: str, threads: int, env: bool = False) -> Fix:
    """The fix that sets torch's intra-op threads (and, with ``env``, says the variable)."""
    also = f"  # or: OMP_NUM_THREADS={threads}" if env else ""
    return Fix(title=title, why=why, code=f"import torch\ntorch.set_num_threads({threads}){also}",
               apply={"torch": {"num_threads": threads}})


def other_load_cores(ev: Evidence) -> float | None:
    """The cores other processes kept busy: the machine's busy cores less the job's own
    (medians over the samples); None where either is unknown."""
    system, job = ev.system, _job_cores(ev)
    if system is None or system.empty or job is None or "busy_cores" not in system:
        return None
    busy = float(np.nanmedian(system["busy_cores"].to_numpy(dtype=float)))
    return max(0.0, busy - job) if np.isfinite(busy) else None


def _job_cores(ev: Evidence) -> float | None:
    host = ev.host
    if host is None or host.empty:
        return None
    per_tick = host.groupby("t_s")["cpu_pct"].sum(min_count=1).dropna()
    return float(per_tick.median() / 100.0) if len(per_tick) else None
