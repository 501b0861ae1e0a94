"""Host probe: CPU, memory and reads of the job's process tree, sampled by the ``doctor run``
parent (never inside the job) through psutil, plus machine-wide load (cores, runnable threads,
iowait). The process tree is rescanned rarely (``children(recursive=True)`` costs ~1 ms and
grows with the host's process count); each tick reads a few counters per known process.
Samples are kept in flat arrays and handed to the store at ``stop()`` (``host.npz``); frames are
built at report time.
"""

from __future__ import annotations

import os
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import psutil

from doctor.machine import private_bytes, usable_cores
from doctor.record.guard import degraded
from doctor.store.data_files import save_data_files
from doctor.store.samples import PROC_COLUMNS, SYSTEM_COLUMNS, save_host, save_others
from doctor.verdict import ProbeStatus

from .exits import ExitWatcher, ProcessExit, recorded_pids
from .open_files import OpenFiles
from .others import OtherProcesses
from .tick_tables import TickTable

if TYPE_CHECKING:
    from doctor.probes import ParentContext

MAX_ROWS = 200_000  # per table; past it, every other tick is dropped (doctor.probes.tick_tables)
#: Private memory (smaps_rollup) is read for every process but the job's first (its parent:
#: forked from nothing of the job's) at most this often, and rarer when reading it costs more
#: than 1/PRIVATE_COST_RATIO of the time between reads (it walks the page tables: ~7-12 ms for
#: a 340 MB process here).
PRIVATE_MIN_S = 2.0
PRIVATE_COST_RATIO = 200.0
#: Threads that run a process's collectives, by the names their libraries give them (gloo's
#: TCP loop and torch's gloo workers; torch's NCCL watchdog; MPI and UCC progress threads):
#: their CPU is the communication's, on the cores the training thread needs.
COMM_THREADS = (b"gloo", b"pt_gloo", b"pt_nccl", b"nccl", b"NCCL", b"pt_mpi", b"ucc")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class HostSampler:
    name = "host"

    def __init__(self, root_pid: int, *, clock: Callable[[], float] = time.monotonic,
                 rescan_s: float = 2.0, proc_stat: Path = Path("/proc/stat"),
                 run_dir: Path | None = None, t0: float | None = None) -> None:
        self.root_pid = root_pid
        self.run_dir = run_dir
        self.clock = clock
        self.rescan_s = rescan_s
        self.proc_stat = proc_stat
        self.t0 = clock() if t0 is None else t0  # sample times count from the run's start
        self._procs: dict[int, psutil.Process] = {}
        self._last_scan = -1e18
        self.tables = HostTables()
        self._last_cpu: np.ndarray | None = None
        self._cores = usable_cores()
        self._status: ProbeStatus | None = None
        self._next_private = -1e18
        self._private_seen: set[int] = set()
        self._comm_threads: dict[int, list[int]] = {}  # pid -> its communication threads
        self._exits: ExitWatcher | None = None  # how the job's processes died (start())
        self._others = OtherProcesses()  # who else took the cores (doctor.probes.others)
        # the files the job reads, the filesystems under them, its connections (open_files):
        # from the parent only; doctor.watch samples its own process, where it would be the job's
        self.files = OpenFiles(root_pid, exclude=[run_dir] if run_dir is not None else []) \
            if root_pid != os.getpid() else None

    @classmethod
    def for_run(cls, context: ParentContext) -> HostSampler:
        return cls(context.root_pid, clock=context.clock, run_dir=context.run_dir,
                   t0=context.t0)

    def check(self) -> ProbeStatus:
        """Whether the job's process can be read; decided once (the job may be gone when it is
        asked again, after the run)."""
        if self._status is None:
            try:
                psutil.Process(self.root_pid).cpu_times()
                self._status = ProbeStatus(True)
            except (psutil.Error, OSError) as err:
                self._status = ProbeStatus(False, f"cannot read the job's process ({err})",
                                           "run doctor as the same user as the job")
        return self._status

    def _scan(self) -> None:
        try:
            root = psutil.Process(self.root_pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        known = {p.pid: p for p in tree}
        # keep the Process objects we already have (psutil caches per-object state)
        self._procs = {pid: self._procs.get(pid, p) for pid, p in known.items()}
        self._comm_threads = {pid: comm_threads(pid) for pid in known}
        if self._exits is not None:
            self._exits.watch(list(known))

    def sample(self) -> None:
        now = self.clock()
        if now - self._last_scan >= self.rescan_s:
            self._scan()
            self._last_scan = now
        if self._exits is not None and self.run_dir is not None:
            self._exits.watch(recorded_pids(self.run_dir))
        t = now - self.t0
        private = now >= self._next_private
        private_cpu = 0.0
        for pid, proc in list(self._procs.items()):
            try:
                with proc.oneshot():
                    cpu = proc.cpu_times()
                    mem = proc.memory_info()
                    threads = proc.num_threads()
                    ppid = proc.ppid()
                    if self._exits is not None and proc.status() == psutil.STATUS_ZOMBIE:
                        self._exits.saw_zombie(pid)
                try:
                    io = proc.io_counters()
                    read = float(io.read_bytes)
                    calls = float(getattr(io, "read_count", float("nan")))
                    chars = float(getattr(io, "read_chars", float("nan")))
                except (psutil.AccessDenied, AttributeError):
                    read = calls = chars = float("nan")
            except psutil.Error:
                self._procs.pop(pid, None)
                continue
            own = float("nan")
            if pid != self.root_pid and (private or pid not in self._private_seen):
                self._private_seen.add(pid)  # a new process is read at once: its baseline
                cpu0 = time.thread_time()
                own = private_bytes(pid)
                private_cpu += time.thread_time() - cpu0
            comm = threads_cpu_s(pid, self._comm_threads.get(pid, []))
            on_cpu, delay = main_thread_times(pid)
            self.tables.add_proc((t, pid, ppid, cpu.user + cpu.system, mem.rss, read, threads,
                                  delay, own, comm, on_cpu, calls, chars))
        if private:  # the CPU it took, not the wall time: on a busy machine that waits too
            self._next_private = now + max(PRIVATE_MIN_S, private_cpu * PRIVATE_COST_RATIO)
        self._sample_system(t)
        self._others.sample(t, self._procs)
        if self.files is not None:
            self.files.sample(t, self._procs)

    def _sample_system(self, t: float) -> None:
        cpu, runnable = read_proc_stat(self.proc_stat)
        if cpu is not None and self._last_cpu is not None:
            delta = cpu - self._last_cpu
            total = float(delta.sum())
            idle, iowait = float(delta[3]), float(delta[4]) if len(delta) > 4 else 0.0
            idle += iowait
            if total > 0:
                # /proc/stat counts every CPU of the machine, whatever our affinity
                cpus = os.cpu_count() or self._cores
                busy = (total - idle) / total * cpus
                io = iowait / total * cpus
                self.tables.add_system((t, self._cores, runnable, busy, io))
        self._last_cpu = cpu

    def start(self) -> None:
        """Start watching how the job's processes end (psutil needs nothing opened; the first
        sample primes the CPU counters)."""
        try:
            self._exits = ExitWatcher(self.root_pid, self.t0, clock=self.clock)
        except Exception as err:  # how processes died is evidence, never a reason to stop sampling
            self._exits = None
            self._status = degraded(self.check(), "watching how the job's processes end", err)

    @property
    def exits(self) -> list[ProcessExit]:
        """The job's processes that died by a signal or exited non-zero, as seen so far."""
        if self._exits is None:
            return []
        # the watcher's thread and the sampler's zombie check may both have read one process
        return list({e.pid: e for e in reversed(self._exits.exits)}.values())[::-1]

    def stop(self) -> None:
        """Hand the samples to the store (``host.npz`` of the run directory)."""
        if self._exits is not None:
            self._exits.stop()
        if self.run_dir is not None:
            save_host(self.run_dir, self.tables.procs, self.tables.system)
            save_others(self.run_dir, self._others.rows)
            if self.files is not None:
                save_data_files(self.run_dir, self.files.scans, self.files.mount_rows())


def main_thread_times(pid: int, proc: str = "/proc") -> tuple[float, float]:
    """(seconds on a core, seconds runnable waiting for one) of the process's main thread so
    far (/proc/PID/schedstat: the thread group leader's); NaN where the kernel does not keep
    them. A thread that is blocked, or stopped (py-spy's pause), grows neither."""
    try:
        with open(f"{proc}/{pid}/schedstat", "rb") as f:
            fields = f.read().split()
        return int(fields[0]) * 1e-9, int(fields[1]) * 1e-9
    except (OSError, ValueError, IndexError):
        return float("nan"), float("nan")


def comm_threads(pid: int, names: tuple[bytes, ...] = COMM_THREADS) -> list[int]:
    """The process's threads that run its collectives (by name; see COMM_THREADS)."""
    found = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm", "rb") as f:
                if f.read().startswith(names):
                    found.append(int(tid))
        except (OSError, ValueError):
            continue
    return found


def threads_cpu_s(pid: int, tids: list[int]) -> float:
    """CPU seconds (user and system) of the process's threads ``tids`` so far; NaN for none
    (a process without communication threads, or one that ended)."""
    if not tids:
        return float("nan")
    total = 0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
        except (OSError, ValueError, IndexError):
            continue
    return total / CLOCK_TICKS


def read_proc_stat(path: Path) -> tuple[np.ndarray | None, float]:
    """(jiffies of the "cpu" line: user nice system idle iowait ..., runnable threads)."""
    cpu: np.ndarray | None = None
    runnable = float("nan")
    try:
        with open(path, "rb") as f:
            for line in f:
                if line.startswith(b"cpu "):
                    cpu = np.array([float(x) for x in line.split()[1:]])
                elif line.startswith(b"procs_running"):
                    runnable = float(line.split()[1])
    except (OSError, ValueError):
        pass
    if cpu is not None and len(cpu) < 4:
        cpu = None
    return cpu, runnable


class HostTables:
    """The host sampler's two tables (doctor.probes.tick_tables): per process, and the machine,
    per tick; each at most MAX_ROWS rows."""

    def __init__(self) -> None:
        self._procs = TickTable(PROC_COLUMNS, MAX_ROWS)
        self._system = TickTable(SYSTEM_COLUMNS, MAX_ROWS)

    def add_proc(self, row: tuple[float, ...]) -> None:
        self._procs.add(row)

    def add_system(self, row: tuple[float, ...]) -> None:
        self._system.add(row)

    @property
    def procs(self) -> dict[str, array]:
        return self._procs.columns

    @property
    def system(self) -> dict[str, array]:
        return self._system.columns

