"""Memory probe: the CUDA caching allocator's statistics (``torch.cuda.memory_stats()``) when the
profiler window opens and closes, at every out-of-memory error, and at exit: allocated vs
reserved bytes, bytes held in split blocks that cannot be reused, allocation retries and OOMs,
which is what allocator fragmentation looks like. Runs inside the job, a handful of times a run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from doctor.verdict import ProbeStatus

MEMORY_FILE = "memory.jsonl"
MEMORY_COLUMNS = ("t_ns", "tag", "device", "allocated_bytes", "reserved_bytes",
                  "inactive_split_bytes", "alloc_retries", "num_ooms", "peak_reserved_bytes")
_KEYS = {
    "allocated_bytes": "allocated_bytes.all.current",
    "reserved_bytes": "reserved_bytes.all.current",
    "inactive_split_bytes": "inactive_split_bytes.all.current",
    "alloc_retries": "num_alloc_retries",
    "num_ooms": "num_ooms",
    "peak_reserved_bytes": "reserved_bytes.all.peak",
}


class MemoryProbe:
    name = "memory"

    def __init__(self, torch_module: Any = None) -> None:
        self._torch = torch_module
        self.directory_of: Callable[[], Path] | None = None

    @property
    def torch(self) -> Any:
        if self._torch is None:
            import torch

            self._torch = torch
        return self._torch

    def check(self) -> ProbeStatus:
        try:
            cuda = self.torch.cuda
            if not cuda.is_available():
                build = "a CPU-only torch build" if getattr(self.torch.version, "cuda", None) \
                    is None else "no CUDA device visible"
                return ProbeStatus(False, f"CUDA allocator statistics need a GPU ({build})",
                                   "allocator fragmentation is checked on GPU jobs")
        except Exception as err:  # a broken CUDA install: say so, do not fail the job
            return ProbeStatus(False, f"torch.cuda failed: {err}", "")
        return ProbeStatus(True)

    def start(self, directory_of: Callable[[], Path]) -> None:
        """Snapshot from now on into the folder ``directory_of()`` names (created on first use);
        also at every CUDA out-of-memory error."""
        self.directory_of = directory_of
        attach = getattr(self.torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is not None:
            try:
                attach(self._on_oom)
            except Exception:  # OOM snapshots are a bonus; window and exit ones still come
                pass

    def _on_oom(self, device: int, alloc: int, device_allocated: int, device_free: int) -> None:
        self.snapshot("oom")

    def snapshot(self, tag: str) -> None:
        if self.directory_of is None:
            return
        try:
            cuda = self.torch.cuda
            if not cuda.is_initialized():
                return  # nothing allocated yet; do not start CUDA for a statistic
            device = cuda.current_device()
            stats = cuda.memory_stats(device)
            row = {"t_ns": time.perf_counter_ns(), "tag": tag, "device": device,
                   **{k: int(stats.get(key, 0)) for k, key in _KEYS.items()}}
            with open(self.directory_of() / MEMORY_FILE, "a") as f:
                f.write(json.dumps(row) + "\n")
        except Exception:  # a statistic must never fail the job
            pass


def load_memory(proc_dirs: list[Path]) -> pd.DataFrame:
    """Every snapshot the given process folders hold (empty frame when none)."""
    rows: list[dict[str, Any]] = []
    for d in proc_dirs:
        path = d / MEMORY_FILE
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut short by a kill
    if not rows:
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in MEMORY_COLUMNS})
    frame = pd.DataFrame(rows)
    frame["t_s"] = (frame["t_ns"] - frame["t_ns"].min()) * 1e-9
    return frame
