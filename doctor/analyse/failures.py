"""Which process of the job failed first, and how: the notes (and the finding) that name it.

A rank or DataLoader worker killed by a signal (SIGKILL from the OOM killer, say) runs no
Python, so its own recorder says nothing; its peers then fail with broken connections
("Connection reset by peer") that their recorders do catch. The ``doctor run`` parent reads
how each process of the tree ended (doctor.probes.exits: the zombie's wait status, and whether
the OOM killer's count rose), kept in run.json's ``deaths``. The first process killed by a
signal is named first; the Python exceptions of the others, and the signals torchrun sends the
survivors, are said to follow from it. Where the parent could not read the status (the process
was reaped first), a DataLoader worker's death is taken from the training process: the Process
objects its exception's frames held (torch's ``failed_workers``, each with its returncode:
doctor.record.killed_children), or torch's own words ("DataLoader worker (pid N) is killed by
signal: Killed"); and a rank that left neither a clean exit nor an exception is named as
killed, without a signal.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from doctor.probes.exits import signal_name
from doctor.store.rundata import RunData
from doctor.verdict import Finding, Fix

#: The signals a launcher (torchrun, a shell, a scheduler) sends to stop processes: a death by
#: one of them follows another failure when there is one.
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
KILL_MARGIN_S = 1.0  # how much later than the death itself the parent may see it


@dataclass(frozen=True)
class Death:
    """One process of the job killed by a signal (``signal`` None: killed, signal unknown)."""

    pid: int
    who: str  # "rank 1", "DataLoader worker 0 of rank 1", "process 123 (a child of rank 0)"
    rank: int | None
    role: str | None
    signal: int | None
    oom_killer: bool | None
    t_s: float | None
    reported: bool = False  # named by a training process's exception (torch's): it came first

    @property
    def recorded(self) -> bool:
        """Whether it is one of the job's recorded processes (a rank's or a worker's folder),
        not a helper the job (or a library) started and may have stopped itself."""
        return self.role is not None

    @property
    def stopped_by_job(self) -> bool:
        """A child a rank forked (a multiprocessing pool's worker, say) ended by a stop signal:
        the job stopping its own helper (``Pool.terminate()`` on leaving its ``with``), never
        what made the job fail."""
        return self.role == "child" and self.signal in STOP_SIGNALS

    @property
    def how(self) -> str:
        if self.signal is None:
            return ("ended without a clean exit and without a Python exception: it was killed "
                    "(a signal such as SIGKILL, or os._exit), though doctor could not read how")
        how = f"was killed by {signal_name(self.signal)}"
        if self.oom_killer:
            how += " (killed by the OOM killer: the machine or its container ran out of memory)"
        return how

    @property
    def short(self) -> str:
        sig = signal_name(self.signal) if self.signal is not None else "a signal"
        return f"{self.who} was killed by {sig}" + (" (OOM killer)" if self.oom_killer else "")


def deaths(run: RunData) -> list[Death]:
    """The job's processes killed by a signal, the first first: those the parent saw die, then
    ranks that left no exit record (when the job failed without being stopped as a whole, and
    had ranks beside them: a job of one training process that left no exit record and exited
    with a status, not a signal, ended itself: ``os._exit(3)``, an exec into a shell that
    exited 7)."""
    procs = run.processes
    mine = procs[procs["node"] == 0] if "node" in procs else procs
    by_pid = {int(p): (int(r), str(role)) for p, r, role in
              zip(mine["pid"], mine["rank"], mine["role"], strict=True)}
    seen = sorted((d for d in run.record.deaths if _int(d.get("signal")) is not None),
                  key=lambda d: (_int(d.get("signal")) in STOP_SIGNALS, _float(d) or 0.0))
    out = [_death(d, by_pid) for d in seen if _int(d.get("pid")) is not None]
    named = {d.pid for d in out}
    for pid, sig in [*_killed_children(procs["crashed_children"]),
                     *_workers_torch_saw_killed(procs["crashed"])]:
        if pid not in named:  # reaped before the parent could read it: torch's word for it
            out.append(replace(_death({"pid": pid, "signal": sig}, by_pid), reported=True))
            named.add(pid)
    r = run.record
    ranks = int((procs["role"].astype(str) == "main").sum())
    if r.exit_code not in (0, None) and not r.signal and len(run.record.nodes) <= 1 and ranks > 1:
        for pid, rank, role, ended, crashed in zip(
                procs["pid"], procs["rank"], procs["role"], procs["ended_ns"], procs["crashed"],
                strict=True):
            if (str(role) == "main" and pd.isna(ended) and not _text(crashed)
                    and int(pid) not in named):
                out.append(Death(int(pid), f"rank {int(rank)}", int(rank), "main", None, None,
                                 None))
    return out


#: torch's error in the training process when a DataLoader worker dies by a signal
#: (torch/utils/data/_utils/signal_handling.py, from the worker's wait status).
_WORKER_KILLED = re.compile(r"DataLoader worker \(pid (\d+)\) is killed by signal: ([^.\n]+)")


def _workers_torch_saw_killed(crashed: Iterable[Any]) -> list[tuple[int, int]]:
    """(pid, signal) of each DataLoader worker whose death by a signal a training process's
    exception reports, in torch's words."""
    names = {signal.strsignal(s): int(s) for s in signal.valid_signals()
             if isinstance(s, signal.Signals) and signal.strsignal(s)}
    found = []
    for text in crashed:
        for pid, description in _WORKER_KILLED.findall(_text(text)):
            if description.strip() in names:
                found.append((int(pid), names[description.strip()]))
    return found


def _killed_children(texts: Iterable[Any]) -> list[tuple[int, int]]:
    """(pid, signal) of each child a training process's uncaught exception was about and a
    signal killed, as that process read it (doctor.record.killed_children: "PID:SIGNAL" pairs):
    where it reaped the child before the parent could read its status."""
    found = []
    for text in texts:
        for pair in _text(text).split():
            pid, _, sig = pair.partition(":")
            if pid.isdigit() and sig.isdigit():
                found.append((int(pid), int(sig)))
    return found


def _death(raw: Mapping[str, Any], by_pid: dict[int, tuple[int, str]]) -> Death:
    pid = int(raw["pid"])
    ppid = _int(raw.get("ppid"))
    oom = raw.get("oom_killer") if isinstance(raw.get("oom_killer"), bool) else None
    sig = _int(raw.get("signal"))
    if pid in by_pid:
        rank, role = by_pid[pid]
        who = (f"rank {rank}" if role == "main" else
               f"DataLoader worker {role.removeprefix('worker')} of rank {rank}"
               if role.startswith("worker") else f"rank {rank} {role}")
        return Death(pid, f"{who} (pid {pid})", rank, role, sig, oom, _float(raw))
    if ppid is not None and ppid in by_pid:
        rank, _role = by_pid[ppid]
        return Death(pid, f"process {pid} (a child of rank {rank})", rank, None, sig,
                     oom, _float(raw))
    return Death(pid, f"process {pid} of the job", None, None, sig, oom, _float(raw))


def failure_notes(run: RunData) -> list[str]:
    """The first failure first (a process killed by a signal, or a rank's exception, whichever
    came first), then the others, each said to follow from it."""
    dead = [d for d in deaths(run) if not d.stopped_by_job]
    if run.record.exit_code == 0:  # only the job's own (recorded) processes are worth a word
        dead = [d for d in dead if d.recorded and d.signal not in STOP_SIGNALS]
    first = first_killed(run, dead)
    if first is None:  # an exception came first: torchrun's SIGTERMs to the others follow it
        crashes = crash_notes(run)
        lead = _first_crash_rank(run)
        after = f"rank {lead} failed" if lead is not None else "another process failed"
        return [*crashes, *(f"{_cap(d.who)} {d.how}, after {after}." for d in dead)]
    notes = [f"{_cap(first.who)} {first.how}; it failed first: the other processes' errors "
             "follow from it (a peer's connection reset or closed, a DataLoader worker that "
             "exited unexpectedly)."]
    notes += [f"{_cap(d.who)} {d.how}, after {first.short}." for d in dead if d is not first]
    return notes + crash_notes(run, first)


def first_killed(run: RunData, dead: list[Death] | None = None) -> Death | None:
    """The process killed by a signal that failed first; None when none was, or when a rank's
    exception came first (a death that exception itself reports came before it). Only the
    job's recorded processes (ranks, workers) are weighed against exceptions; a helper process
    counts only where nothing else explains a failed job. SIGTERM, SIGINT and SIGHUP are what a
    launcher sends the survivors of a failure, so a process they ended comes first only when
    nothing else failed. The parent sees a death a little after it happens while a peer's
    connection breaks at once, so an exception counts as first only when it came KILL_MARGIN_S
    before the death was seen."""
    dead = [d for d in (deaths(run) if dead is None else dead) if not d.stopped_by_job]
    if not dead:
        return None
    recorded = [d for d in dead if d.recorded]
    causes = [d for d in recorded if d.signal not in STOP_SIGNALS]
    procs = run.processes
    crashed = procs.loc[procs["crashed"].notna(), "crashed_ns"].dropna()
    if procs["crashed"].notna().sum() == 0:
        if run.record.exit_code == 0:  # a helper the job stopped itself is no failure
            return causes[0] if causes else None
        return (causes or recorded or dead)[0]
    t0_ns = run.record.t0_ns.get(0)
    if crashed.empty or t0_ns is None:
        return None
    for d in causes:
        if d.reported or (d.t_s is not None
                          and t0_ns + (d.t_s - KILL_MARGIN_S) * 1e9 < float(crashed.min())):
            return d
    return None


def _first_crash_rank(run: RunData) -> int | None:
    procs = run.processes
    crashed = procs[procs["crashed"].notna() & procs["crashed_ns"].notna()]
    if crashed.empty:
        return None
    return int(crashed.sort_values("crashed_ns")["rank"].iloc[0])


def crash_notes(run: RunData, first: Death | None = None) -> list[str]:
    """Which ranks died of an exception, the first one first: the others usually died of it
    (a peer's connection closed), so they are marked as following it; all of them follow a
    process killed by a signal before them (``first``)."""
    procs = run.processes
    crashed = procs[procs["crashed"].notna() & ~procs["role"].astype(str).str.startswith("worker")]
    rows = sorted((float(c) if pd.notna(c) else 0.0, int(rank), str(why))
                  for c, rank, why in zip(crashed["crashed_ns"], crashed["rank"],
                                          crashed["crashed"], strict=True))
    notes = []
    for i, (_t, rank, why) in enumerate(rows):
        after = (f" (after {first.short})" if first is not None else
                 f" (after rank {rows[0][1]} failed)" if i and len(rows) > 1 else "")
        notes.append(f"Rank {rank} failed{after}: {why}")
    return notes


def failure_finding(run: RunData) -> Finding | None:
    """The finding that names the first process killed by a signal (None when none was)."""
    d = first_killed(run)
    if d is None:
        return None
    fixes: tuple[Fix, ...] = ()
    if d.oom_killer:
        fixes = (Fix(
            title="Make the job fit in memory",
            why="the kernel's OOM killer ended it when memory ran out: a smaller batch, fewer "
                "DataLoader workers or a lower prefetch_factor, or a larger memory limit for "
                "the container"),)
    sig = signal_name(d.signal) if d.signal is not None else None
    evidence: dict[str, Any] = {"pid": d.pid, "rank": d.rank, "role": d.role, "signal": sig,
                                "oom_killer": d.oom_killer, "t_s": d.t_s}
    return Finding(
        id="failure.killed", category="other", severity="critical",
        title=f"{_cap(d.who)} {d.how}",
        evidence={k: v for k, v in evidence.items() if v is not None}, fixes=fixes)


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _text(value: Any) -> str:
    return "" if value is None or (isinstance(value, float) and pd.isna(value)) else str(value)


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError):
        return None


def _float(raw: Mapping[str, Any]) -> float | None:
    """The death's time (seconds from the run's start); None where run.json has none that is
    a finite number."""
    try:
        t = float(raw["t_s"])
    except (KeyError, TypeError, ValueError):
        return None
    return t if t == t and abs(t) != float("inf") else None


__all__ = ["Death", "crash_notes", "deaths", "failure_finding", "failure_notes",
           "first_killed"]
