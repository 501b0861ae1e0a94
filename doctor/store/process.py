"""One process folder of a run, as the job's Session writes it (layout in doctor.store.layout).

A process folder is named by role and pid, and a pid can record twice: a process that
``os.exec``s another Python keeps its pid, and a pid is reused on a long run. The second
recorder never writes into the first one's folder (that would truncate its rings). The folder
that recorded training steps keeps the name the analysis reads; the other is kept beside it as
``<role>-<pid>.<N>``, which the analysis does not read: the new image when the earlier one
trained (a job that trained, then exec'd a helper), else the earlier folder (a launcher that
exec'd the job, even one that read a few batches first).

This runs inside every process of the job: it imports no more than it writes with (no pandas)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from doctor.store import layout
from doctor.store.ringbuffer import RingWriter

#: The rings whose presence says a folder recorded training steps: ``doctor.step()`` calls,
#: optimizer steps, ``backward()`` calls (a DataLoader's cadence alone is not training).
TRAINING_RINGS = ("steps", "optimizer", "backward")


class ProcessWriter:
    """Writes ``RUN_DIR/rank-<R>/<role>-<pid>/``; the folder is made by ``create()``."""

    def __init__(self, run_dir: Path, rank: int, role: str, pid: int) -> None:
        self.run_dir = run_dir
        self.path = layout.process_dir(run_dir, rank, role, pid)

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
        tmp = self.path / (layout.META + ".tmp")
        tmp.write_text(json.dumps(dict(meta), default=str))
        tmp.replace(self.path / layout.META)

    def ring(self, name: str, fmt: str, names: tuple[str, ...], capacity: int) -> RingWriter:
        return RingWriter(layout.ring_path(self.path, name), fmt, names, capacity)

    def append_memory(self, row: Mapping[str, Any]) -> None:
        """One allocator snapshot, a line of JSON (doctor.store.samples reads them)."""
        with open(self.path / layout.MEMORY, "a") as f:
            f.write(json.dumps(dict(row)) + "\n")

    def trace_path(self) -> Path:
        """Where the profiler window exports its trace (compressed after the job)."""
        return self.path / layout.TRACE


def trained(proc_dir: Path) -> bool:
    """Whether the process folder holds a ring of training steps."""
    return any(layout.ring_path(proc_dir, name).is_file() for name in TRAINING_RINGS)


def _free_beside(path: Path) -> Path:
    """``<folder>.<N>`` with the lowest N that is free."""
    n = 1
    while (beside := path.with_name(f"{path.name}.{n}")).exists():
        n += 1
    return beside
