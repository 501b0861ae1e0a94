"""Small tensors read without making the job wait: the loss of each backward() (is it finite?)
and a GradScaler's scale after each update (probes/steps.py), one element each; the overflow
watch's flags, one per gradient (probes/overflow_watch.py), read as a list.

On a CPU the value is read at once (``item()``: a fraction of a microsecond, nothing to wait
for). On a GPU it is copied, non-blocking, into a pinned host buffer behind a CUDA event, and
read at a later call once that event has passed (``query()`` never waits): a step late, as the
GPU gets there. At most SLOTS copies are in flight; a value whose slot is not free is not read
(counted in ``dropped``). While the stream is being captured into a CUDA graph nothing is copied
(the value is dropped) and no event is asked: ``cudaEventQuery`` during a capture invalidates the
job's graph (seen on an H100: the job's ``torch.cuda.graph`` failed at its optimizer step with
cudaErrorStreamCaptureInvalidated); what is in flight is read after the capture. torch is
imported by the caller; nothing here raises: a failure turns the reader off.

Measured on an H200 (gVisor, torch 2.11): a put on the GPU costs about 10 us of host time
(the event's record 5, the copy's launch 3.5, the detach 1, the rest under a microsecond); with
torch's sync debug mode set to "error" nothing synchronised, and 200 values put were read back
right; with the GPU busy (4096-square matmuls) the host ran ahead and the values beyond SLOTS in
flight were dropped, none waited for.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

SLOTS = 4  # copies in flight on a GPU: a step late, or a few where the host runs ahead
FINAL_WAIT_S = 0.1  # at the end, how long the copies still in flight are waited for, at most


class LateReads:
    """Values of small tensors (a float for one element, else a list), each with the tag it
    was put with, in the order put."""

    def __init__(self, torch: Any) -> None:
        self._torch = torch
        self._pending: deque[tuple[Any, Any, Any]] = deque()  # (tag, buffer, event) in flight
        self._free: dict[Any, list[tuple[Any, Any]]] = {}  # (dtype, shape) -> (buffer, event)
        self.off = False  # a failure turned the reader off
        self.dropped = 0  # values not read: every slot in flight, or the stream capturing

    @property
    def pending(self) -> bool:
        """Whether a value is still in flight."""
        return bool(self._pending)

    def put(self, tensor: Any, tag: Any) -> list[tuple[Any, Any]]:
        """Read ``tensor`` with ``tag``: the (tag, value) pairs ready now, in the order they
        were put (``tensor``'s own among them on a CPU)."""
        if self.off:
            return []
        try:
            if tensor.is_cuda:
                if capturing(self._torch):
                    self.dropped += 1
                    return []
                ready = self.ready() if self._pending else []
                self._copy(tensor, tag)
                return ready
            if tensor.is_cpu:  # nothing in flight: the CPU's values are read at once
                value = _value(tensor)
                return [*self.ready(), (tag, value)] if self._pending else [(tag, value)]
            return self.ready()
        except Exception:  # never into the job: an odd tensor, a CUDA error
            self.off = True
            return []

    def ready(self) -> list[tuple[Any, Any]]:
        """The values whose copies have landed, in the order put; none waits (none is asked
        while the stream is captured)."""
        out: list[tuple[Any, Any]] = []
        try:
            if self._pending and capturing(self._torch):
                return out
            while self._pending and self._pending[0][2].query():
                tag, buf, event = self._pending.popleft()
                out.append((tag, _value(buf)))
                self._free.setdefault((buf.dtype, buf.shape), []).append((buf, event))
        except Exception:
            self.off = True
        return out

    def final(self, wait_s: float = FINAL_WAIT_S) -> list[tuple[Any, Any]]:
        """At the end: the values in flight, waited for up to ``wait_s`` (asked every
        millisecond, never blocking on the GPU: a hung one costs ``wait_s``)."""
        out = self.ready()
        deadline = time.monotonic() + wait_s
        while self._pending and not self.off and time.monotonic() < deadline:
            time.sleep(0.001)
            out += self.ready()
        return out

    def _copy(self, tensor: Any, tag: Any) -> None:
        cuda = self._torch.cuda
        if len(self._pending) >= SLOTS:
            self.dropped += 1
            return
        free = self._free.get((tensor.dtype, tensor.shape))
        if free:
            buf, event = free.pop()
        else:
            buf = self._torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            event = cuda.Event()
        buf.copy_(tensor.detach(), non_blocking=True)
        event.record()
        self._pending.append((tag, buf, event))


def capturing(torch: Any) -> bool:
    """Whether this thread's current CUDA stream is being captured into a CUDA graph (then no
    CUDA call but the job's own may run: a query or a synchronisation invalidates the capture,
    and a kernel launched would join the job's graph). Raises where torch has no CUDA."""
    return bool(torch.cuda.is_current_stream_capturing())


def _value(tensor: Any) -> Any:
    """A host tensor's value: a float for one element, else its list."""
    return float(tensor.item()) if tensor.numel() == 1 else tensor.tolist()
