"""Memory probe: the CUDA caching allocator's statistics (``torch.cuda.memory_stats()``) over the
whole run: allocated vs reserved bytes, the peak allocated so far, bytes held in split blocks
that cannot be reused, allocation retries and OOMs (what allocator fragmentation looks like).

Snapshots are taken at step boundaries about once a second (``SAMPLE_S``; the steps between two
are counted, so a step costs one comparison), when the profiler window opens and closes, at
every out-of-memory error and at exit. A long run spaces them out (twice as far apart every
``ROWS_PER_DOUBLING`` rows), so the file stays bounded. The peak is the allocator's own running
peak: it is never reset, since the job may read ``max_memory_allocated()`` itself. Runs inside
the job; the snapshots go to the process folder through the Session.
"""

from __future__ import annotations

from typing import Any

from ..record.session import CLOSE, WINDOW_END, WINDOW_START, Session
from ..verdict import ProbeStatus

_KEYS = {
    "allocated_bytes": "allocated_bytes.all.current",
    "reserved_bytes": "reserved_bytes.all.current",
    "inactive_split_bytes": "inactive_split_bytes.all.current",
    "alloc_retries": "num_alloc_retries",
    "num_ooms": "num_ooms",
    "peak_reserved_bytes": "reserved_bytes.all.peak",
    "peak_allocated_bytes": "allocated_bytes.all.peak",
}
SAMPLE_S = 1.0
ROWS_PER_DOUBLING = 2000


class MemoryProbe:
    name = "memory"

    def __init__(self, session: Session, torch_module: Any = None) -> None:
        self.session = session
        self._torch = torch_module
        self.started = False
        self.rows = 0
        self._next_step = 1  # the steady-step count of the next step snapshot
        self._every = 1  # steps between two step snapshots, fitted to SAMPLE_S
        self._last_ns: int | None = None
        self._totals: dict[int, int] = {}  # device -> its memory (bytes)

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
        self.session.on_step(self._on_step)
        attach = getattr(self.torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is not None:
            try:
                attach(self._on_oom)
            except Exception as err:  # OOM snapshots are a bonus; window and exit ones still come
                self.session.swallowed(self.name, "watching for out-of-memory errors", err)

    def sample(self) -> None:
        pass  # event-driven: at step boundaries and a few events

    def stop(self) -> None:
        self.started = False
        self.session.off_step(self._on_step)

    def _on_step(self, count: int) -> None:
        if count < self._next_step:
            if count + self._every < self._next_step:  # the count restarted (a new step kind)
                self._next_step = count
            return
        now = self.session.clock()
        if self._last_ns is not None:
            interval = SAMPLE_S * 2 ** (self.rows // ROWS_PER_DOUBLING) * 1e9
            took = now - self._last_ns
            if took < interval / 2:
                self._every *= 2
            elif took > interval * 2 and self._every > 1:
                self._every //= 2
        self._last_ns = now
        self._next_step = count + self._every
        self.snapshot("step", step=count)

    def _at_exit(self) -> None:
        if self.session.recording:  # do not make a folder for a process that trained nothing
            self.snapshot("exit")

    def _on_oom(self, device: int, alloc: int, device_allocated: int, device_free: int) -> None:
        self.snapshot("oom")

    def _stats(self, cuda: Any, device: int) -> dict[str, Any]:
        """The allocator's statistics: torch's nested dict straight from C++ where it has one
        (``memory_stats()`` flattens it in Python, ~110 keys a call), else the flat one."""
        nested = getattr(self.torch._C, "_cuda_memoryStats", None)
        if nested is not None:
            try:
                return dict(nested(device))
            except Exception:  # another torch's signature: the public function then
                pass
        return dict(cuda.memory_stats(device))

    def snapshot(self, tag: str, step: int | None = None) -> None:
        if not self.started:
            return
        try:
            cuda = self.torch.cuda
            if not cuda.is_initialized():
                return  # nothing allocated yet; do not start CUDA for a statistic
            device = cuda.current_device()
            stats = self._stats(cuda, device)
            total = self._totals.get(device)
            if total is None:
                total = self._totals[device] = int(cuda.get_device_properties(device)
                                                   .total_memory)
            self.session.record_memory({"t_ns": self.session.clock(), "tag": tag,
                                        "device": device, "step": step, "total_bytes": total,
                                        **{k: _lookup(stats, key) for k, key in _KEYS.items()}})
            self.rows += 1
        except Exception as err:  # a statistic must never fail the job
            self.session.swallowed(self.name, "a snapshot of the allocator", err)


def _lookup(stats: dict[str, Any], key: str) -> int:
    """``key`` ("allocated_bytes.all.current") in flat or nested statistics; 0 if absent."""
    if key in stats:
        return int(stats[key])
    value: Any = stats
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return 0
        value = value[part]
    return int(value) if isinstance(value, int | float) else 0
