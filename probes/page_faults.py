"""Page-faults probe: the training process's minor page faults per step over a few steps just
before the profiler window and a few steps after it.

What the window leaves in the process shows here first: its large allocations and frees can
raise glibc's mmap threshold, after which the job's own large tensors stop paying a page fault
per 4 KiB on every step (doctor.analyse.window_drift, doctor.rules.allocator). Faults are counted
by the kernel (``getrusage``), so unlike step times they do not move with other work on the
machine. Four reads a run, at step boundaries: ``SPAN`` steps before the window opens, as it
opens (before the profiler starts: this probe's step listener comes first), and from ``SKIP``
steps after it closed for ``SPAN`` steps. Each span goes to the ``page_faults`` ring as one
interval (its start and end on the Session's clock; its key: the faults). Runs inside the job.
"""

from __future__ import annotations

from typing import Any

from ..record.session import WINDOW_END, Session
from ..verdict import ProbeStatus

SPAN = 4  # steps a span counts
SKIP = 1  # steps after the window's closing step before the after-span starts
KEY_MAX = 2**31 - 1  # an interval's key is an int32


def minor_faults() -> int:
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)


class PageFaultsProbe:
    name = "page_faults"

    def __init__(self, session: Session, faults: Any = None) -> None:
        self.session = session
        self.faults = faults or minor_faults
        start = session.window_start
        self._marks = [start - SPAN, start] if start - SPAN >= 2 else []
        self._read: tuple[int, int] | None = None  # (clock, faults) at the span's start
        self._count = 0
        self._after = False  # the marks are those after the window
        self.spans: list[tuple[int, int, int]] = []  # (t0, t1, faults)

    def check(self) -> ProbeStatus:
        if self.session.window_steps <= 0:
            return ProbeStatus(False, "the profiler window is off (--window off)",
                               "page faults are compared before and after the window")
        if not self._marks:
            return ProbeStatus(False, f"the window opens at step {self.session.window_start}: "
                               f"too early for {SPAN} steps before it", "")
        try:
            self.faults()
        except Exception as err:  # no getrusage (not POSIX)
            return ProbeStatus(False, f"getrusage failed: {err}", "")
        return ProbeStatus(True)

    def start(self) -> None:
        self.session.on_step(self._on_step)
        self.session.on(WINDOW_END, self._window_end)

    def sample(self) -> None:
        pass  # a few reads at step boundaries

    def stop(self) -> None:
        self.session.off_step(self._on_step)
        self._marks = []

    def _on_step(self, count: int) -> None:
        self._count = count
        if not self._marks or count != self._marks[0]:
            return
        self._marks.pop(0)
        try:
            now = (self.session.clock(), self.faults())
        except Exception as err:  # a measurement never fails the job
            self._marks = []
            self.session.swallowed(self.name, "reading the page faults", err)
            return
        if self._read is None:
            self._read = now
            return
        (t0, f0), (t1, f1) = self._read, now
        self._read = None
        faults = min(f1 - f0, KEY_MAX)
        self.spans.append((t0, t1, faults))
        self.session.record_interval("page_faults", t0, t1, faults)
        if self._after:  # both spans read: nothing more to do per step
            self.session.off_step(self._on_step)

    def _window_end(self) -> None:
        """The window closed at the step just counted: the span after it starts SKIP steps on."""
        closed = self._count
        self._marks = [closed + SKIP, closed + SKIP + SPAN]
        self._read = None
        self._after = True
