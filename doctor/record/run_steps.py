"""Every step of the run, counted and timed, in bounded space: the ``run_steps`` ring.

The detailed rings (a record per DataLoader wait, backward, optimizer step) hold the newest
RING_CAPACITY records each: at 20 steps a second, the last 1.8 hours of a run. So that a run of
days still counts every step and keeps every spike, the Session also folds each counted step
boundary (doctor.record.step_count) into a bucket of BUCKET_STEPS steps, and writes one record
per bucket: when it began and ended, how many steps it holds, the kind of boundary counted, and
its shortest and longest step with when the longest ended. A bucket closes early where the
counted kind changes (a stronger kind of boundary appears), and the open bucket is written at
close. At 128 steps a bucket, the ring's 131,072 records hold 16.7 million steps (9.7 days at 20
steps a second), in at most 7 MB.

Cost on the training thread: a clock read and a few integer operations per step (the clock is
read once more where the boundary's own time is not at hand); one ring write per 128 steps.
"""

from __future__ import annotations

from collections.abc import Callable

from ..store.records import RUN_STEPS_RECORD

BUCKET_STEPS = 128


class RunSteps:
    """The open bucket of counted steps, written through ``write`` when it closes."""

    __slots__ = ("kind", "last", "max_end", "max_ns", "min_ns", "start", "steps", "write")

    def __init__(self, write: Callable[..., None]) -> None:
        self.write = write
        self.kind = -1
        self.last = 0  # the previous boundary (0: none yet)
        self.start = 0  # the bucket's first step's start
        self.steps = 0
        self.max_ns = -1
        self.max_end = 0
        self.min_ns = 0

    def saw(self, now: int, kind: int, first: bool) -> None:
        """A counted step boundary of ``kind`` at ``now``: the step since the previous one;
        ``first``: the count starts again here (a stronger kind of boundary appeared)."""
        if first or kind != self.kind:
            self.flush()
            self.kind, self.last = kind, now
            return
        took = now - self.last
        if self.steps == 0:
            self.start, self.max_ns, self.min_ns = self.last, -1, took
        self.steps += 1
        if took > self.max_ns:
            self.max_ns, self.max_end = took, now
        if took < self.min_ns:
            self.min_ns = took
        self.last = now
        if self.steps >= BUCKET_STEPS:
            self.flush()

    def flush(self) -> None:
        """Write the open bucket, if it holds a step."""
        if self.steps:
            self.write(self.start, self.last, self.steps, self.kind, self.min_ns, self.max_ns,
                       self.max_end)
            self.steps = 0


__all__ = ["BUCKET_STEPS", "RUN_STEPS_RECORD", "RunSteps"]
