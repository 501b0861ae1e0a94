"""Where the job's data comes from: the files its processes (workers included) hold open, the
filesystem each is on, and the network connections and bytes of the job. Read by the ``doctor
run`` parent (the host probe, doctor.probes.host) from /proc, never inside the job.

At the host probe's pace, at most as often as a scan costs 1/COST_RATIO of the time between two
(a scan reads one link per descriptor: ~2 us each), each process's descriptors
(``/proc/PID/fd``, at most MAX_FDS each) are read:

- a regular file opened for reading, outside doctor's run directory and the interpreter's own
  files, is a data file: the first time it is seen, its size and the mount under it
  (doctor.probes.mounts, from the job's own mount table) are kept, and once per directory the
  sizes of the files beside it (at most DIR_ENTRIES: the dataset's size, at least);
- a socket is counted; sockets that are TCP connections fetching from a peer
  (``/proc/PID/net/tcp*``, read at their own pace: TCP_S, and rarer where a read costs more)
  are counted, those to another host apart; a socket opened since the last table counts as the
  share of new sockets that turned out to be fetches (an estimate: a short request's socket
  closes before the next table);
- the job's network namespace's received bytes (``/proc/PID/net/dev``): on the loopback device
  and on the others. They are the namespace's, not the job's alone, unless the job has a
  namespace of its own (``netns_own``): said with them.

Opens are not seen one by one: a file held open between two scans is seen, so the distinct files
seen a second are a lower bound of the opens a second. Bounded: at most MAX_FILES files and
MAX_SCANS scan rows.
"""

from __future__ import annotations

import os
import stat
import tempfile
import time
from array import array
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from doctor.store.data_files import SCAN_COLUMNS

from .mounts import Mount, mount_of, read_mountinfo

SCAN_S = 0.5
COST_RATIO = 200.0  # a scan takes at most 0.5 % of a core
MAX_FDS = 512  # per process and scan
MAX_FILES = 20_000
MAX_SCANS = 100_000
DIR_ENTRIES = 50_000  # a data directory's files whose sizes are summed, once
MAX_DIRS = 64
#: Files of the interpreter and its libraries, never the job's data.
_CODE = (".py", ".pyc", ".so")
_SYSTEM = ("/proc/", "/sys/", "/dev/pts", "/dev/null", "/dev/tty", "/dev/urandom", "/dev/zero")
_LISTEN = b"0A"
TCP_S = 2.0
UNKNOWN, NOT_TCP, LOOPBACK, REMOTE = -1, 0, 1, 2


class OpenFiles:
    def __init__(self, root_pid: int, *, exclude: Iterable[Path] = (), proc: Path = Path("/proc"),
                 cpu_clock: Callable[[], float] = time.thread_time) -> None:
        self.root_pid = root_pid
        self.proc = proc
        self.cpu_clock = cpu_clock
        self.exclude = tuple(str(p).rstrip("/") + "/" for p in exclude)
        self.scans: dict[str, array] = {c: array("d") for c in SCAN_COLUMNS}
        self.files: dict[str, tuple[float, int, int]] = {}  # path -> (first seen, size, mount)
        self.dirs: dict[str, tuple[int, int, int]] = {}  # dir -> (files, bytes, mount)
        self._mounts: list[Mount] | None = None
        self._netns_own: float | None = None
        self._next = -1e18
        self._reading: dict[tuple[int, str, str], bool] = {}  # (pid, fd, path): data read
        self._sockets: dict[int, int] = {}  # socket inode -> NOT_TCP, LOOPBACK or REMOTE
        self._next_tcp = -1e18
        self._tcp_cost = 0.0
        self._learned = self._fetches = self._remote = 0  # new sockets classified, by kind

    def sample(self, t: float, pids: Iterable[int]) -> None:
        """At ``t`` (seconds from the run's start): scan, if due. Never raises."""
        if t < self._next or len(self.scans["t_s"]) >= MAX_SCANS:
            return
        cpu0 = self.cpu_clock()
        try:
            row = self._scan(t, list(pids))
        except OSError:
            row = None
        cost = self.cpu_clock() - cpu0
        # the TCP tables keep their own pace (TCP_S): the descriptors' scans keep theirs
        self._next = t + max(SCAN_S, (cost - self._tcp_cost) * COST_RATIO)
        if row is not None:
            row["scan_cpu_s"] = cost
            for c in SCAN_COLUMNS:
                self.scans[c].append(float(row[c]))

    def _scan(self, t: float, pids: list[int]) -> dict[str, float]:
        if self._mounts is None:
            self._mounts = read_mountinfo(self.proc / str(self.root_pid) / "mountinfo")
            self._netns_own = netns_own(self.proc, self.root_pid)
        open_now: set[str] = set()
        sockets: set[int] = set()
        new = 0
        for pid in pids:
            for fd, target in fd_targets(self.proc, pid):
                if target.startswith("socket:["):
                    sockets.add(int(target[8:-1]))
                elif target not in open_now and self._is_data(target) and \
                        self._reads(pid, fd, target):
                    open_now.add(target)
                    if target not in self.files and len(self.files) < MAX_FILES and \
                            self._keep_new(t, target):
                        new += 1
        self._tcp_cost = 0.0
        if any(i not in self._sockets for i in sockets) and t >= self._next_tcp:
            self._learn_sockets(t, sockets)
        kinds = [self._sockets.get(i, UNKNOWN) for i in sockets]
        # a socket opened since the last TCP table counts as the share of new sockets that
        # were fetches (a short request's socket is gone before the next table: it is not
        # known one by one); all of it before any was learned
        share = self._fetches / self._learned if self._learned else 1.0
        conns = sum(k in (LOOPBACK, REMOTE) for k in kinds) + share * kinds.count(UNKNOWN)
        remote = sum(k == REMOTE for k in kinds) + \
            (self._remote / self._learned if self._learned else 0.0) * kinds.count(UNKNOWN)
        lo, other = received_bytes(self.proc, self.root_pid)
        return {"t_s": t, "files_open": len(open_now), "files_new": new,
                "sockets": len(sockets), "connections": conns, "remote_connections": remote,
                "rx_lo_bytes": lo, "rx_bytes": other,
                "netns_own": float("nan") if self._netns_own is None else self._netns_own}

    def _learn_sockets(self, t: float, sockets: set[int]) -> None:
        """Which of the new socket inodes are TCP connections, and to where, from the job's
        TCP tables: read at most every TCP_S, and rarer where reading them costs more than
        1/COST_RATIO of the time between two (the kernel walks its hash tables: ms)."""
        cpu0 = self.cpu_clock()
        table = tcp_table(self.proc, self.root_pid)
        if len(self._sockets) >= 4 * MAX_FILES:
            self._sockets.clear()
        for inode in sockets:
            if inode not in self._sockets:
                kind = self._sockets[inode] = table.get(inode, NOT_TCP)
                self._learned += 1
                self._fetches += kind != NOT_TCP
                self._remote += kind == REMOTE
        self._tcp_cost = self.cpu_clock() - cpu0
        self._next_tcp = t + max(TCP_S, self._tcp_cost * COST_RATIO)

    def _is_data(self, path: str) -> bool:
        if not path.startswith("/") or path.endswith(_CODE) or path.startswith(self.exclude):
            return False
        if path.startswith(_SYSTEM) or "/site-packages/" in path or "/lib/python3" in path:
            return False
        name = path.rsplit("/", 1)[-1]
        return not (path.startswith("/dev/") and (not path.startswith("/dev/shm/")
                                                   or name.startswith(("torch_", "sem."))))

    def _reads(self, pid: int, fd: str, path: str) -> bool:
        """Whether descriptor ``fd`` of ``pid`` has ``path`` open for reading only (its flags
        read once per descriptor and path: a checkpoint or a log written is not data)."""
        key = (pid, fd, path)
        known = self._reading.get(key)
        if known is None:
            if len(self._reading) >= 4 * MAX_FILES:
                self._reading.clear()
            try:
                with open(self.proc / str(pid) / "fdinfo" / fd, "rb") as f:
                    flags = next((int(line.split()[1], 8) for line in f
                                  if line.startswith(b"flags:")), -1)
                known = flags >= 0 and flags & os.O_ACCMODE == os.O_RDONLY
            except (OSError, ValueError, IndexError):
                known = False
            self._reading[key] = known
        return known

    def _keep_new(self, t: float, path: str) -> bool:
        """Keep a data file seen for the first time, if it is a regular file."""
        # the path as the job sees it: through its root where it has one of its own
        seen = self.proc / str(self.root_pid) / "root"
        local = f"{seen}{path}" if seen.is_dir() and not os.path.samefile(seen, "/") else path
        try:
            st = os.stat(local)
        except OSError:
            return False
        if not stat.S_ISREG(st.st_mode):
            return False
        mount = mount_of(path, self._mounts or [])
        self.files[path] = (t, st.st_size, mount)
        folder = os.path.dirname(path)
        if folder not in self.dirs and len(self.dirs) < MAX_DIRS:
            self.dirs[folder] = (*directory_size(os.path.dirname(local)), mount)
        return True

    def mount_rows(self) -> list[dict[str, Any]]:
        """One row per mount the data files were on: its kind, the files seen and their bytes,
        the bytes of the directories they were in, and its free and total space."""
        mounts = self._mounts or []
        rows: dict[int, dict[str, Any]] = {}
        for _, size, m in self.files.values():
            if m < 0:
                continue
            row = rows.setdefault(m, {**mounts[m].describe(), "role": "data", "files_seen": 0,
                                      "bytes_seen": 0, "dir_files": 0, "dir_bytes": 0})
            row["files_seen"] += 1
            row["bytes_seen"] += size
        for files, size, m in self.dirs.values():
            if m in rows:
                rows[m]["dir_files"] += files
                rows[m]["dir_bytes"] += size
        if rows:  # where the data could be staged: the temporary folder's disk, /dev/shm
            for place in (tempfile.gettempdir(), "/dev/shm"):
                m = mount_of(place, mounts)
                if m >= 0 and m not in rows:
                    rows[m] = {**mounts[m].describe(), "role": "staging", "files_seen": 0,
                               "bytes_seen": 0, "dir_files": 0, "dir_bytes": 0}
        for m, row in rows.items():
            row.update(free_space(mounts[m].mount_point))
        return list(rows.values())


def fd_targets(proc: Path, pid: int) -> list[tuple[str, str]]:
    """(fd, link target) of a process's descriptors, at most MAX_FDS; none once it is gone."""
    base = f"{proc}/{pid}/fd"
    try:
        fds = os.listdir(base)[:MAX_FDS]
    except OSError:
        return []
    out = []
    for fd in fds:
        try:
            out.append((fd, os.readlink(f"{base}/{fd}")))
        except OSError:
            continue
    return out


def directory_size(folder: str) -> tuple[int, int]:
    """(files, bytes) of the regular files directly in ``folder``, at most DIR_ENTRIES."""
    files = size = 0
    try:
        with os.scandir(folder) as it:
            for i, entry in enumerate(it):
                if i >= DIR_ENTRIES:
                    break
                try:
                    if entry.is_file(follow_symlinks=False):
                        files += 1
                        size += entry.stat(follow_symlinks=False).st_size
                except OSError:
                    continue
    except OSError:
        pass
    return files, size


def free_space(mount_point: str) -> dict[str, float]:
    try:
        st = os.statvfs(mount_point)
    except OSError:
        return {"free_bytes": float("nan"), "total_bytes": float("nan")}
    return {"free_bytes": float(st.f_bavail * st.f_frsize),
            "total_bytes": float(st.f_blocks * st.f_frsize)}


def tcp_table(proc: Path, pid: int) -> dict[int, int]:
    """Socket inode -> LOOPBACK or REMOTE for each TCP connection of the job's network
    namespace that fetches from a peer (/proc/PID/net/tcp and tcp6). Listening sockets, and
    the connections they accepted (a server's end, such as a store the job serves itself), are
    NOT_TCP: the job's fetches are the other ends."""
    rows = []
    for name in ("tcp", "tcp6"):
        try:
            with open(proc / str(pid) / "net" / name, "rb") as f:
                next(f, None)
                rows += [fields for line in f if len(fields := line.split()) >= 10]
        except OSError:
            continue
    listening = {r[1].rsplit(b":", 1)[-1] for r in rows if r[3] == _LISTEN}
    out: dict[int, int] = {}
    for r in rows:
        try:
            inode = int(r[9])
        except ValueError:
            continue
        served = r[3] == _LISTEN or r[1].rsplit(b":", 1)[-1] in listening
        out[inode] = NOT_TCP if served else \
            LOOPBACK if is_loopback(r[2].split(b":")[0].decode()) else REMOTE
    return out


def is_loopback(hex_addr: str) -> bool:
    """An address of /proc/net/tcp (IPv4: 8 hex digits, little-endian; IPv6: 32) on the
    loopback: 127.0.0.0/8, ::1, or ::ffff:127.x.x.x."""
    if len(hex_addr) == 8:
        return hex_addr[6:8] == "7F"
    if len(hex_addr) == 32:
        if hex_addr == "0" * 24 + "01000000":
            return True
        return hex_addr[:24] == "0000000000000000FFFF0000" and hex_addr[30:32] == "7F"
    return False


def received_bytes(proc: Path, pid: int) -> tuple[float, float]:
    """(bytes received on the loopback, on the other devices) of the job's network namespace
    so far (/proc/PID/net/dev); NaN where unreadable."""
    lo = other = 0.0
    try:
        with open(proc / str(pid) / "net" / "dev", "rb") as f:
            for line in list(f)[2:]:
                name, _, counters = line.partition(b":")
                rx = float(counters.split()[0])
                if name.strip() == b"lo":
                    lo += rx
                else:
                    other += rx
    except (OSError, ValueError, IndexError):
        return float("nan"), float("nan")
    return lo, other


def netns_own(proc: Path, pid: int) -> float | None:
    """1.0 when the job's network namespace is not doctor's (its counters are the job's and
    whatever else runs in it), 0.0 when shared with doctor, None where unknown."""
    try:
        theirs = os.readlink(proc / str(pid) / "ns" / "net")
        return float(theirs != os.readlink("/proc/self/ns/net"))
    except OSError:
        return None
