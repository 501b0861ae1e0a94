"""One process folder of a run, as the job's Session writes it (layout in doctor.store.layout).

A process folder is named by role and pid, and a pid can record twice: a process that
``os.exec``s another Python keeps its pid, and a pid is reused on a long run. The second
recorder never writes into the first one's folder (that would truncate its rings). The folder
that recorded training steps keeps the name the analysis reads; the other is kept beside it as
``<role>-<pid>.<N>``, which the analysis does not read: the new image when the earlier one
trained (a job that trained, then exec'd a helper), else the earlier folder (a launcher that
exec'd the job, even one that read a few batches first).

This runs inside every process of the job: it imports no more than it writes with (no pandas).
Every file is created exclusively and never through a link (doctor.store.safe_files); a write
that fails (a full disk, a read-only or failing filesystem) raises ``OSError`` to the Session,
which stops what wrote it and says so, never the job.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from . import layout
from .ringbuffer import OnStop, RingWriter
from .safe_files import named_new, write_text_atomic

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

#: The rings whose presence says a folder recorded training steps: ``doctor.step()`` calls,
#: optimizer steps, ``backward()`` calls, CUDA graph replays (a DataLoader's cadence alone is
#: not training).
TRAINING_RINGS = ("steps", "optimizer", "backward", "graph_replay")


class ProcessWriter:
    """Writes ``RUN_DIR/rank-<R>/<role>-<pid>/``; the folder is made by ``create()``."""

    def __init__(self, run_dir: Path, rank: int, role: str, pid: int) -> None:
        self.run_dir = run_dir
        self.path = layout.process_dir(run_dir, rank, role, pid)
        self._memory_fd = -1

    def create(self) -> Path:
        """Make the folder: the canonical one, or where an earlier recorder of this pid left
        one, the folder that keeps both (see the module's docstring)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(100):  # repeats only where the folder vanished between two calls
            try:
                self.path.mkdir()
                return self.path
            except FileExistsError:
                pass
            aside = _free_beside(self.path)
            if trained(self.path):
                aside.mkdir()
                self.path = aside
                return self.path
            try:
                os.rename(self.path, aside)
            except FileNotFoundError:
                continue
        self.path.mkdir(exist_ok=True)
        return self.path

    def write_meta(self, meta: Mapping[str, Any]) -> None:
        write_text_atomic(self.path / layout.META, json.dumps(dict(meta), default=str))

    def ring(self, name: str, fmt: str, names: tuple[str, ...], capacity: int,
             on_stop: OnStop | None = None) -> RingWriter:
        return RingWriter(layout.ring_path(self.path, name), fmt, names, capacity, on_stop)

    def append_memory(self, row: Mapping[str, Any]) -> None:
        """One allocator snapshot, a line of JSON (doctor.store.samples reads them). A line that
        could not be written whole is taken back, so the file stays whole lines."""
        line = (json.dumps(dict(row)) + "\n").encode()
        if self._memory_fd < 0:
            self._memory_fd = _create_appending(self.path / layout.MEMORY)
        end = os.lseek(self._memory_fd, 0, os.SEEK_END)
        try:
            done = os.write(self._memory_fd, line)
            if done != len(line):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # a short write
        except OSError:
            try:
                os.ftruncate(self._memory_fd, end)
            except OSError:
                pass
            raise

    def trace_path(self, window: int = 1) -> Path:
        """Where the ``window``-th profiler window exports its trace (compressed after the
        job)."""
        return self.path / layout.trace_name(window)

    def export_trace(self, export: Callable[[str], Any], window: int = 1) -> None:
        """Have ``export`` (torch.profiler's ``export_chrome_trace``, which opens a file by name)
        write the window's trace into a fresh file beside it, renamed into place only when it
        ends as JSON does: Kineto does not raise when it cannot write (a full disk), and a trace
        cut short is removed rather than left to misread."""
        with named_new(self.trace_path(window)) as tmp:
            export(str(tmp))
            with open(tmp, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                f.seek(max(0, size - 64))
                tail = f.read().rstrip()
            if not tail.endswith((b"}", b"]")):
                raise OSError(errno.ENOSPC, f"the profiler's trace export stopped at {size} bytes "
                                            "(is the disk full?)")

    def close(self) -> None:
        if self._memory_fd >= 0:
            try:
                os.close(self._memory_fd)
            except OSError:
                pass
            self._memory_fd = -1


def _create_appending(path: Path) -> int:
    """A new file for appending, created exclusively and never through a link (what is there
    is replaced)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | _NOFOLLOW | _CLOEXEC
    try:
        return os.open(path, flags, 0o644)
    except FileExistsError:
        os.unlink(path)
        return os.open(path, flags, 0o644)

def trained(proc_dir: Path) -> bool:
    """Whether the process folder holds a ring of training steps."""
    return any(layout.ring_path(proc_dir, name).is_file() for name in TRAINING_RINGS)


def _free_beside(path: Path) -> Path:
    """``<folder>.<N>`` with the lowest N that is free."""
    n = 1
    while (beside := path.with_name(f"{path.name}.{n}")).exists():
        n += 1
    return beside
