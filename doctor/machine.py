"""Facts about the machine that several parts of doctor need."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity), not the machine's total."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def memory_bytes() -> int | None:
    """The memory this process may use: the machine's RAM, or its container's limit (cgroup v2
    or v1) where that is lower; None when neither can be read."""
    total: int | None = None
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    for path in _CGROUP_LIMITS:
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and (total is None or int(text) < total):
            total = int(text)  # "max" (no limit) and v1's huge sentinel leave RAM as it is
    return total


def private_bytes(pid: int | str = "self") -> float:
    """Bytes only this process maps (Private_Clean + Private_Dirty of /proc/PID/smaps_rollup:
    its unique set). Unlike RSS, it grows when a forked DataLoader worker copies the pages of
    Python objects it only reads (reference counts write to them); NaN where unreadable."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            total = 0
            for line in f:
                if line.startswith((b"Private_Clean:", b"Private_Dirty:")):
                    total += int(line.split()[1]) * 1024
            return float(total)
    except (OSError, ValueError, IndexError):
        return float("nan")


def rss_bytes(pid: int | str = "self") -> float:
    """Resident bytes of the process (/proc/PID/statm); NaN where unreadable."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return float(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError):
        return float("nan")
