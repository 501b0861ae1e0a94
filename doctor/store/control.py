"""Signals between ``doctor run`` (the parent) and the job's processes: one small file.

The job's processes say when their profiler window opens and closes (the parent starts py-spy on
a rank when its window opens), and when a later window opens (py-spy samples it again); the
parent, or ``doctor.watch``, says which stack recorder the processes should use (``in-process``
where py-spy is missing or ptrace is refused). Each signal
is one JSON object on one line, appended with a single ``write`` to a file opened ``O_APPEND``,
so that many processes writing at once never interleave; the reader takes the last word on each
key. A run writes a handful of lines, so reading the whole file at every tick costs nothing. The
file is opened ``O_NOFOLLOW`` (a link planted at its name is refused, never written through),
and the first writer creates it with ``O_EXCL``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .layout import CONTROL

IN_PROCESS = "in-process"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True)
class Control:
    """What the signals say now."""

    stacks_mode: str | None = None  # None: py-spy from the parent; "in-process": the fallback
    stacks_reason: str = ""
    windows: dict[tuple[int, int], str] = field(default_factory=dict)  # (rank, pid) -> state
    #: (rank, pid) -> the facts that came with each state: {state: {"steps": N, "t_s": T}}
    window_facts: dict[tuple[int, int], dict[str, dict[str, Any]]] = field(default_factory=dict)
    #: (rank, pid) -> the numbers of the later windows it opened (the parent samples their stacks)
    later: dict[tuple[int, int], list[int]] = field(default_factory=dict)

    def open_windows(self) -> list[tuple[int, int]]:
        """(rank, pid) of every main process whose window has opened (active or done)."""
        return [key for key, state in self.windows.items() if state in ("active", "done")]


def _post(run_dir: Path, signal: dict[str, Any]) -> None:
    line = (json.dumps(signal, separators=(",", ":")) + "\n").encode()
    fd = _open_for_append(run_dir / CONTROL)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _open_for_append(path: Path) -> int:
    """The control file open for appending, never through a link planted at its name (an
    ``OSError`` then): the file as it is, or created here, exclusively, by the first writer."""
    for _ in range(3):
        try:
            return os.open(path, os.O_WRONLY | os.O_APPEND | _NOFOLLOW | _CLOEXEC)
        except FileNotFoundError:
            pass
        try:
            return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | _NOFOLLOW
                           | _CLOEXEC, 0o644)
        except FileExistsError:
            continue  # another process of the run created it meanwhile: append to theirs
    raise FileExistsError(f"{path} keeps appearing and disappearing")


def post_window(run_dir: Path, rank: int, pid: int, state: str, **facts: Any) -> None:
    """A process's profiler window changed state (active, done, failed); ``facts`` (its steps,
    the process's clock in seconds) go with it for the parent's progress lines."""
    _post(run_dir, {"window": state, "rank": rank, "pid": pid,
                    **{k: v for k, v in facts.items() if v is not None}})


def post_later_window(run_dir: Path, rank: int, pid: int, window: int) -> None:
    """A process opened its ``window``-th profiler window (a later one: the run slowed down)."""
    _post(run_dir, {"later_window": window, "rank": rank, "pid": pid})


def post_stacks_mode(run_dir: Path, mode: str, reason: str) -> None:
    """Which stack recorder the job's processes should use from now on, and why."""
    _post(run_dir, {"stacks": mode, "reason": reason})


def read_control(run_dir: Path) -> Control:
    try:
        text = (run_dir / CONTROL).read_text()
    except OSError:
        return Control()
    mode, reason = None, ""
    windows: dict[tuple[int, int], str] = {}
    facts: dict[tuple[int, int], dict[str, dict[str, Any]]] = {}
    later: dict[tuple[int, int], list[int]] = {}
    for line in text.splitlines():
        try:
            signal = json.loads(line)
        except ValueError:
            continue  # a line cut short by a kill
        if "stacks" in signal:
            mode, reason = str(signal["stacks"]), str(signal.get("reason", ""))
        elif "window" in signal:
            key, state = (int(signal["rank"]), int(signal["pid"])), str(signal["window"])
            windows[key] = state
            facts.setdefault(key, {})[state] = {k: v for k, v in signal.items()
                                                if k not in ("window", "rank", "pid")}
        elif "later_window" in signal:
            key = (int(signal["rank"]), int(signal["pid"]))
            later.setdefault(key, []).append(int(signal["later_window"]))
    return Control(mode, reason, windows, facts, later)


def in_process_stacks(run_dir: Path) -> bool:
    """Whether the job's processes should sample their own stacks."""
    return read_control(run_dir).stacks_mode == IN_PROCESS
