"""Which processes outside the job took the machine's cores: read by the ``doctor run`` parent
(the host probe, doctor.probes.host) from /proc, never inside the job.

Every ``every_s`` seconds (SCAN_S, or longer where a scan costs more than 1/COST_RATIO of the
time between two: /proc has a file per process of the machine), the CPU time of every process
(``/proc/PID/stat``: utime and stime) is read; against the previous scan, each process burnt so
many cores between the two. The ones outside the job's tree and doctor's own (this process and
its children, py-spy) that burnt MIN_CORES or more are kept (the TOP busiest of each scan): the
scan's span, the pid, its name (``comm``, 15 characters) and its cores. The analysis names them
beside the machine's load (doctor.analyse.machine_load). Bounded: at most MAX_ROWS rows.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

SCAN_S = 5.0
COST_RATIO = 200.0  # a scan takes at most 0.5 % of the time between two
MIN_CORES = 0.2
TOP = 5
MAX_ROWS = 20_000
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class OtherProcesses:
    def __init__(self, proc: Path = Path("/proc"), *,
                 cpu_clock: Callable[[], float] = time.thread_time) -> None:
        self.proc = proc
        self.cpu_clock = cpu_clock
        self.rows: list[dict[str, Any]] = []
        self._last: tuple[float, dict[int, tuple[float, str, int]]] | None = None
        self._next = -1e18
        self._own = os.getpid()

    def sample(self, t: float, job: Iterable[int]) -> None:
        """At ``t`` (seconds from the run's start): scan, if due. Never raises."""
        if t < self._next:
            return
        cpu0 = self.cpu_clock()
        try:
            now = read_all(self.proc)
        except OSError:
            now = {}
        cost = self.cpu_clock() - cpu0
        self._next = t + max(SCAN_S, cost * COST_RATIO)
        if self._last is not None and now:
            t0, before = self._last
            self._keep(t0, t, before, now, set(job))
        self._last = (t, now)

    def _keep(self, t0: float, t1: float, before: dict[int, tuple[float, str, int]],
              now: dict[int, tuple[float, str, int]], job: set[int]) -> None:
        span = t1 - t0
        if span <= 0 or len(self.rows) >= MAX_ROWS:
            return
        busy = []
        for pid, (cpu, name, ppid) in now.items():
            if pid in job or pid == self._own or ppid == self._own or pid not in before:
                continue
            cores = (cpu - before[pid][0]) / span
            if cores >= MIN_CORES:
                busy.append((cores, pid, name))
        for cores, pid, name in sorted(busy, reverse=True)[:TOP]:
            self.rows.append({"t0_s": t0, "t1_s": t1, "pid": pid, "name": name,
                              "cores": round(cores, 3)})


def read_all(proc: Path) -> dict[int, tuple[float, str, int]]:
    """pid -> (CPU seconds so far, name, parent pid) of every process /proc shows."""
    out = {}
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            with open(os.path.join(entry.path, "stat"), "rb") as f:
                text = f.read()
            head, _, rest = text.rpartition(b")")
            name = head.split(b"(", 1)[1].decode("utf-8", "replace")
            fields = rest.split()
            out[int(entry.name)] = ((int(fields[11]) + int(fields[12])) / CLOCK_TICKS, name,
                                    int(fields[1]))
        except (OSError, ValueError, IndexError):
            continue
    return out
