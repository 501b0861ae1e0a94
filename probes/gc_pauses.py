"""GC probe: the pauses of Python's garbage collector, from ``gc.callbacks``.

A collection runs on the thread whose allocation triggered it and holds the GIL throughout: a
full (generation 2) collection of a large heap pauses the training loop for tens or hundreds of
milliseconds, and makes that step slow (doctor.analyse.causes names it). The callback is called
as each collection starts and ends; it times every one, and writes to the ``gc`` ring (an
interval: start and end on the Session's clock; its key: the generation and the objects
collected, doctor.store.records.gc_key) only those that can make a step slow: every full
collection, and any other of WRITTEN_NS or more. Generation 0 and 1 collections come hundreds
of times a second and take microseconds: they are only counted, per generation, with their
total pause, and the counts go to meta.json (``gc``) as the process closes, with the longest
pause of all (a full collection during the imports, before the ring is written, included).

The ring is written only once the process records anything else (its folder exists): a helper
process that never trains leaves no folder for its collections. A forked child counts its own
collections from zero. Runs inside the job; a failure in the callback is caught and said as the
probe's reason (doctor.record.guard), never raised into the collection that called it.
"""

from __future__ import annotations

import gc
from typing import Any

from ..record.session import CLOSE, Session
from ..store.records import gc_key
from ..verdict import ProbeStatus

WRITTEN_NS = 1_000_000  # a young collection this long (1 ms) or longer is written too
GENERATIONS = 3


class GcProbe:
    name = "gc"

    def __init__(self, session: Session) -> None:
        self.session = session
        self._clock = session.clock
        self._t0 = 0
        self._pid = session.pid
        self._started = False
        self._reset()

    def _reset(self) -> None:
        self.collections = [0] * GENERATIONS  # per generation
        self.pause_ns = [0] * GENERATIONS
        self.collected = [0] * GENERATIONS
        self.written = 0
        self.longest_ns = 0  # of every collection, written or not

    def check(self) -> ProbeStatus:
        if not isinstance(getattr(gc, "callbacks", None), list):
            return ProbeStatus(False, "this Python has no gc.callbacks",
                               "garbage collector pauses are measured on CPython")
        return ProbeStatus(True)

    def start(self) -> None:
        self.session.on(CLOSE, self._close)
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)
        self._started = True

    def sample(self) -> None:
        pass  # the collector calls back

    def stop(self) -> None:
        self._started = False
        try:
            gc.callbacks.remove(self._callback)
        except ValueError:
            pass

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        """``gc.callbacks``' hook: the start and the end of each collection."""
        try:
            if phase == "start":
                self._t0 = self._clock()
                return
            t1 = self._clock()
            t0 = self._t0
            if self.session.pid != self._pid:  # a forked child: its own counts from now
                self._forked()
            generation = info["generation"]
            took = t1 - t0
            if 0 <= generation < GENERATIONS:
                self.collections[generation] += 1
                self.pause_ns[generation] += took
                self.collected[generation] += info["collected"]
            if took > self.longest_ns:
                self.longest_ns = took
            if (generation >= 2 or took >= WRITTEN_NS) and t0 and self.session.recording:
                self.session.record_interval("gc", t0, t1, gc_key(generation,
                                                                  info["collected"]))
                self.written += 1
        except Exception as err:  # never into the collection that called us
            self.session.swallowed(self.name, "timing a garbage collection", err)

    def _forked(self) -> None:
        self._pid = self.session.pid
        self._reset()
        self.session.on(CLOSE, self._close)  # the child's Session forgot its listeners

    def _close(self) -> None:
        """Per generation, the collections, their pause and the objects collected, in the
        process's meta.json (where it recorded anything)."""
        try:
            if self.session.recording:
                self.session.update_meta(gc={
                    "collections": list(self.collections), "pause_ns": list(self.pause_ns),
                    "collected": list(self.collected), "written": self.written,
                    "longest_ns": self.longest_ns,
                    "written_ns": WRITTEN_NS})
        except Exception as err:
            self.session.swallowed(self.name, "saving the collections' counts", err)
