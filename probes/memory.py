"""Memory probe: the CUDA caching allocator's statistics (``torch.cuda.memory_stats()``) when the
profiler window opens and closes, at every out-of-memory error, and at exit: allocated vs
reserved bytes, bytes held in split blocks that cannot be reused, allocation retries and OOMs,
which is what allocator fragmentation looks like. Runs inside the job, a handful of times a run;
the snapshots go to the process folder through the Session.
"""

from __future__ import annotations

import time
from typing import Any

from doctor.record.session import CLOSE, WINDOW_END, WINDOW_START, Session
from doctor.verdict import ProbeStatus

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

    def __init__(self, session: Session, torch_module: Any = None) -> None:
        self.session = session
        self._torch = torch_module
        self.started = False

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

    def start(self) -> None:
        """Snapshot at the window's start and end, at exit (when the process recorded
        anything), and at every CUDA out-of-memory error."""
        self.started = True
        self.session.on(WINDOW_START, lambda: self.snapshot("window_start"))
        self.session.on(WINDOW_END, lambda: self.snapshot("window_end"))
        self.session.on(CLOSE, self._at_exit)
        attach = getattr(self.torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is not None:
            try:
                attach(self._on_oom)
            except Exception:  # OOM snapshots are a bonus; window and exit ones still come
                pass

    def sample(self) -> None:
        pass  # event-driven: a few snapshots a run

    def stop(self) -> None:
        self.started = False

    def _at_exit(self) -> None:
        if self.session.recording:  # do not make a folder for a process that trained nothing
            self.snapshot("exit")

    def _on_oom(self, device: int, alloc: int, device_allocated: int, device_free: int) -> None:
        self.snapshot("oom")

    def snapshot(self, tag: str) -> None:
        if not self.started:
            return
        try:
            cuda = self.torch.cuda
            if not cuda.is_initialized():
                return  # nothing allocated yet; do not start CUDA for a statistic
            device = cuda.current_device()
            stats = cuda.memory_stats(device)
            self.session.record_memory({"t_ns": time.perf_counter_ns(), "tag": tag,
                                        "device": device,
                                        **{k: int(stats.get(key, 0)) for k, key in _KEYS.items()}})
        except Exception:  # a statistic must never fail the job
            pass
