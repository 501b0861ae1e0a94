"""How the job's processes died: the signal that ended a rank or a DataLoader worker, and
whether the OOM killer sent it, read by the ``doctor run`` parent (never inside the job).

A process killed by a signal runs no Python: its own recorder never learns it died. Its parent
(torchrun, the DataLoader's main process) reaps it, and until then it is a zombie whose
``/proc/PID/stat`` field 52 (``exit_code``, Linux >= 3.5) holds its wait status. torchrun
reaps within its monitor interval (0.1 s), far less than the host sampler's 0.5 s tick, so the
parent watches each process of the tree through a pidfd (Linux >= 5.3, Python >= 3.9): it
becomes readable the moment the process exits, and a thread blocked in ``poll`` reads the
zombie's status at once. Where pidfds are not available, the host sampler's ticks read
zombies they happen to see (``read_exit``).

The OOM killer sends SIGKILL; the kernel counts its kills (``oom_kill`` in the memory cgroup's
``memory.events`` (v2) or ``memory.oom_control`` (v1), and machine-wide in ``/proc/vmstat``).
A SIGKILL while that counter rose is said to come from the OOM killer; without a counter to
read, nothing is claimed.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

EXIT_CODE_FIELD = 52  # /proc/PID/stat, counted from 1 as proc(5) does
POLL_MS = 200  # how long stop() waits for the thread, at most, after waking it


@dataclass(frozen=True)
class ProcessExit:
    """One process of the job that ended badly: by a signal, or with a non-zero status."""

    pid: int
    ppid: int | None
    t_s: float  # seconds from the run's start
    signal: int | None = None  # the signal that killed it
    exit_status: int | None = None  # its exit status, when it exited (not killed)
    core_dumped: bool = False
    oom_killer: bool | None = None  # True: the OOM killer's count rose; None: not known

    @property
    def signal_name(self) -> str:
        return signal_name(self.signal) if self.signal else ""

    def to_dict(self) -> dict[str, object]:
        return {k: v for k, v in asdict(self).items()
                if v is not None and not (k == "core_dumped" and not v)}


def signal_name(number: int) -> str:
    """SIGKILL for 9; "signal 70" for a number without a name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def read_exit(pid: int, proc: Path = Path("/proc")) -> tuple[int, int | None] | None:
    """(wait status, ppid) of ``pid`` if it is a zombie (dead, not yet reaped), else None."""
    try:
        raw = (proc / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    fields = raw.rsplit(b")", 1)[-1].split()  # the name may hold spaces and parentheses
    # fields[0] is field 3 (state); field N is fields[N - 3]
    if not fields or fields[0] != b"Z" or len(fields) <= EXIT_CODE_FIELD - 3:
        return None
    try:
        return int(fields[EXIT_CODE_FIELD - 3]), int(fields[1])
    except ValueError:
        return None


def decode(pid: int, ppid: int | None, status: int, t_s: float,
           oom_killer: bool | None) -> ProcessExit | None:
    """The ProcessExit of a wait status; None for a clean exit (status 0)."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return ProcessExit(pid, ppid, t_s, signal=sig, core_dumped=bool(status & 0x80),
                           oom_killer=oom_killer if sig == signal.SIGKILL else None)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) != 0:
        return ProcessExit(pid, ppid, t_s, exit_status=os.WEXITSTATUS(status))
    return None


def oom_kill_counters(root_pid: int, proc: Path = Path("/proc"),
                      cgroups: Path = Path("/sys/fs/cgroup")) -> list[Path]:
    """The files whose ``oom_kill`` line counts the OOM killer's kills that could hit the job:
    its memory cgroup's (v2 ``memory.events``, v1 ``memory.oom_control``), then the machine's
    (``/proc/vmstat``); those that exist and say ``oom_kill``."""
    found: list[Path] = []
    try:
        lines = (proc / str(root_pid) / "cgroup").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _id, controllers, path = parts
        rel = path.lstrip("/")
        if controllers == "":
            found.append(cgroups / rel / "memory.events")
        elif "memory" in controllers.split(","):
            found.append(cgroups / "memory" / rel / "memory.oom_control")
    found.append(proc / "vmstat")
    return [p for p in found if read_oom_kills(p) is not None]


def read_oom_kills(path: Path) -> int | None:
    """The ``oom_kill`` count of one of the files above; None where it cannot be read."""
    try:
        with open(path, "rb") as f:
            for line in f:
                if line.startswith(b"oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def recorded_pids(run_dir: Path) -> list[int]:
    """The pids of the job's process folders (``rank-R/ROLE-PID``, made as each process starts
    recording: a DataLoader worker at its first batch), by their names alone: a worker that
    lives less than the host sampler's rescan is watched from its folder."""
    pids = []
    try:
        ranks = [e.path for e in os.scandir(run_dir) if e.name.startswith("rank-")]
    except OSError:
        return []
    for rank_dir in ranks:
        try:
            names = [e.name for e in os.scandir(rank_dir)]
        except OSError:
            continue
        for name in names:
            _role, _, pid = name.rpartition("-")
            if pid.isdigit():
                pids.append(int(pid))
    return pids


class ExitWatcher:
    """Watches pids (added as the host sampler finds them) and keeps how each that ended badly
    ended. ``exits`` is read after ``stop()``."""

    def __init__(self, root_pid: int, t0: float, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.root_pid = root_pid
        self.t0 = t0
        self.clock = clock
        self.exits: list[ProcessExit] = []
        self._seen: set[int] = set()  # pids watched or already decided
        self._fds: dict[int, int] = {}  # pidfd -> pid
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._counters = oom_kill_counters(root_pid)
        self._oom_before = self._oom_kills()
        self._thread: threading.Thread | None = None
        self._wake_r = self._wake_w = -1  # a byte written wakes the thread: new pids, or stop
        if hasattr(os, "pidfd_open"):
            self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            self._thread = threading.Thread(target=self._run, name="doctor-exits", daemon=True)
            self._thread.start()

    def _oom_kills(self) -> list[int | None]:
        return [read_oom_kills(p) for p in self._counters]

    def watch(self, pids: list[int]) -> None:
        """Watch these pids too (the root is left out: ``doctor run`` reaps it itself)."""
        if self._thread is None:
            return
        for pid in pids:
            if pid in self._seen or pid == self.root_pid:
                continue
            self._seen.add(pid)
            try:
                fd = os.pidfd_open(pid)
            except OSError:  # already gone, or not ours to watch
                continue
            with self._lock:
                self._fds[fd] = pid
            self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"w")
        except OSError:  # the pipe is full (the thread wakes anyway) or closed (stopped)
            pass

    def saw_zombie(self, pid: int) -> None:
        """The host sampler saw ``pid`` as a zombie: read its status (where no pidfd did)."""
        if pid == self.root_pid or any(e.pid == pid for e in self.exits):
            return
        with self._lock:
            watched = pid in self._fds.values()
        if not watched:
            self._ended(pid)

    def _run(self) -> None:
        """Sleep until a watched process ends or the wake pipe is written (no periodic
        wake-ups: the job's cores are the job's)."""
        while not self._stop.is_set():
            with self._lock:
                fds = dict(self._fds)
            poller = select.poll()
            poller.register(self._wake_r, select.POLLIN)
            for fd in fds:
                poller.register(fd, select.POLLIN)
            try:
                ready = poller.poll()
            except OSError:
                ready = []
            for fd, _events in ready:
                if fd == self._wake_r:
                    try:
                        os.read(self._wake_r, 4096)
                    except OSError:
                        pass
                    continue
                pid = fds[fd]
                self._ended(pid)
                with self._lock:
                    self._fds.pop(fd, None)
                os.close(fd)

    def _ended(self, pid: int) -> None:
        got = read_exit(pid)
        if got is None:  # reaped before it could be read: how it ended is not known
            return
        status, ppid = got
        now = self._oom_kills()
        rose = [b is not None and n is not None and n > b
                for b, n in zip(self._oom_before, now, strict=True)]
        oom = any(rose) if self._counters else None
        self._oom_before = now
        ended = decode(pid, ppid, status, self.clock() - self.t0, oom)
        if ended is not None:
            self.exits.append(ended)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._wake()
            self._thread.join(timeout=2 * POLL_MS / 1000 + 1)
        with self._lock:
            fds, self._fds = self._fds, {}
        if self._thread is not None and not self._thread.is_alive():
            fds.update({self._wake_r: -1, self._wake_w: -1})
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass


__all__ = [
    "ExitWatcher",
    "ProcessExit",
    "decode",
    "oom_kill_counters",
    "read_exit",
    "read_oom_kills",
    "recorded_pids",
    "signal_name",
]
