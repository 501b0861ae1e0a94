"""One process folder of a run, as the job's Session writes it (layout in doctor.store.layout).

This runs inside every process of the job: it imports no more than it writes with (no pandas)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from doctor.store import layout
from doctor.store.ringbuffer import RingWriter


class ProcessWriter:
    """Writes ``RUN_DIR/rank-<R>/<role>-<pid>/``; the folder is made by ``create()``."""

    def __init__(self, run_dir: Path, rank: int, role: str, pid: int) -> None:
        self.run_dir = run_dir
        self.path = layout.process_dir(run_dir, rank, role, pid)

    def create(self) -> Path:
        self.path.mkdir(parents=True, exist_ok=True)
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
