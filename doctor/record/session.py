"""The per-process Session: the in-process recorder that the probes write through.

One Session per Python process of the job (started by the bootstrap under ``doctor run``, or by
``doctor.watch``). It creates its process folder lazily, on the first thing it records, so
processes that never train (the torchrun launcher, helper subprocesses) leave nothing behind;
the folder's layout belongs to doctor.store.

What probes use (and nothing else):

- hot path: ``mark_step``, ``record_optimizer_start``/``_end``, ``record_interval`` and
  ``record_event`` write fixed-size records into ring buffers; ``count_step`` counts a step
  boundary (the one listener, the profiler window, acts only at its start and end);
- ``on_step(callback)``: called with the count of steady steps at each step boundary of the
  strongest kind seen so far (the profiler window counts its steps with it);
- ``on(event, callback)`` / ``emit(event)`` for the rare events between probes
  (``window_start``, ``window_end``, ``close``);
- ``update_meta``, ``record_loader``, ``record_batch_tensors``, ``record_memory``,
  ``export_trace``, ``trace_path()`` and ``directory`` for what the process folder holds;
- ``swallowed(probe, what, err)``: from a probe's ``except`` branch, a measurement that failed
  and was caught so that the job goes on (doctor.record.guard): its first is the probe's reason.

None of these raises to the job when a write fails (a full, read-only or failing disk): what
wrote stops recording, and its probe's status says ``stopped: <the error>`` once.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..machine import usable_cores
from ..store import layout
from ..store.process import ProcessWriter
from ..store.records import (  # noqa: F401  (the step kinds and events probes record)
    EVENT_RECORD,
    EVENT_WINDOW_START,
    EVENT_WINDOW_STOP_BEGIN,
    EVENT_WINDOW_STOP_END,
    INTERVAL_RECORD,
    RING_PROBES,
    RUN_STEPS_RECORD,
    STEP_BACKWARD,
    STEP_DATALOADER,
    STEP_GRAPH,
    STEP_KIND_NAMES,
    STEP_MANUAL,
    STEP_OPTIMIZER,
    STEPS_RECORD,
)
from ..store.ringbuffer import RingWriter
from ..verdict import ProbeStatus
from .guard import degraded
from .process_facts import cuda_device, env_int, torch_facts
from .run_steps import RunSteps
from .step_count import StepCounter
from .tracer import allow_parent_tracer
from .window import DEFAULT_WINDOW

# Events between probes (``on``/``emit``).
WINDOW_START, WINDOW_END, CLOSE = "window_start", "window_end", "close"

RING_CAPACITY = 1 << 17  # records per ring: at most about 3 MB a ring, whatever the run's length
STOPPED_HINT = ("the job was not affected; make room where the run directory is (or give --out "
                "on another filesystem) and run again for the whole run")

Clock = Callable[[], int]

_current: Session | None = None
_lock = threading.Lock()
_fork_hook = False


# Inside a job under `doctor run` this module is PRIVATE_PACKAGE.record.session (the bootstrap
# loads doctor's in-job code under that name, doctor.record._bootstrap.sitecustomize); the job's
# own `import doctor` (doctor.step(), doctor.watch) loads the public copy, which defers to it.
PRIVATE_PACKAGE = "_doctor_job"
_PRIVATE_SESSION = PRIVATE_PACKAGE + ".record.session"


def current() -> Session | None:
    """This process's Session: the bootstrap's under ``doctor run``, or ``doctor.watch``'s."""
    if _current is None and __name__ != _PRIVATE_SESSION:
        private = sys.modules.get(_PRIVATE_SESSION)
        if private is not None:
            found: Session | None = private.current()
            return found
    return _current


def install(session: Session) -> Session:
    """Make ``session`` this process's Session (the first one wins)."""
    global _current, _fork_hook
    with _lock:
        if _current is None:
            _current = session
            if not _fork_hook:
                os.register_at_fork(after_in_child=_after_fork_in_child)
                _fork_hook = True
        return _current


def uninstall(session: Session) -> None:
    global _current
    with _lock:
        if _current is session:
            _current = None


def _after_fork_in_child() -> None:
    if _current is not None:
        _current.forked()


class Session:
    """In-process recorder for one process of the job."""

    def __init__(
        self,
        run_dir: Path,
        *,
        rank: int | None = None,
        role: str = "main",
        clock: Clock = time.perf_counter_ns,
        window_start: int = DEFAULT_WINDOW.start,
        window_steps: int = DEFAULT_WINDOW.steps,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.rank = int(os.environ.get("RANK", "0")) if rank is None else rank
        self.role = role
        self.clock = clock
        self.window_start = window_start
        self.window_steps = window_steps
        self.pid = os.getpid()
        self.started_ns = clock()
        self.closed = False
        self.probe_status: dict[str, dict[str, Any]] = {}
        self._reset()

    def _reset(self) -> None:
        # one folder and one ring each, whichever thread records first (a job training in
        # threads made two folders for one process); a fresh lock in a forked child
        self._making = threading.RLock()
        self._writer: ProcessWriter | None = None
        self._rings: dict[str, RingWriter] = {}
        self._meta: dict[str, Any] = {}
        self._loaders: dict[tuple[Any, ...], int] = {}
        # Counting steps for the deep window (doctor.record.step_count)
        self._counter = StepCounter()
        self._run_steps = RunSteps(self._write_run_steps)  # every step, bucketed
        self._step_listeners: tuple[Callable[[int], None], ...] = ()
        self._listeners: dict[str, list[Callable[[], None]]] = {}
        self._opt_t0 = 0
        self._optimizers: list[weakref.ref[Any]] = []

    # ----- lazily created storage -------------------------------------------------------
    @property
    def recording(self) -> bool:
        """Whether this process has recorded anything (its folder exists)."""
        return self._writer is not None

    @property
    def writer(self) -> ProcessWriter:
        """The process folder's writer; ``OSError`` when the folder cannot be made (a full or
        read-only disk): the callers below record nothing then, and never raise to the job."""
        if self._writer is None:
            with self._making:
                if self._writer is None:
                    self._make_writer()
        assert self._writer is not None
        return self._writer

    def _make_writer(self) -> None:
        from ..store.redact import redact_argv  # here, not at start-up: the first record

        writer = ProcessWriter(self.run_dir, self.rank, self.role, self.pid)
        writer.create()
        self._writer = writer
        self._meta = {
            "pid": self.pid, "ppid": os.getppid(), "rank": self.rank, "role": self.role,
            "argv": redact_argv(sys.argv), "local_rank": env_int("LOCAL_RANK"),
            "world_size": env_int("WORLD_SIZE"), "host": os.uname().nodename,
            "started_ns": self.clock(), "cores": usable_cores(), "probes": self.probe_status,
            **torch_facts(), **self._meta,
        }
        self._save_meta()

    @property
    def directory(self) -> Path:
        """This process's folder (created on first use; ``OSError`` where it cannot be)."""
        return self.writer.path

    def ring(self, name: str, fmt: str, names: tuple[str, ...]) -> RingWriter:
        """The ring ``name``, made on first use. One that cannot be made or grown (a full
        disk) records nothing more, and its probe's status says so: never an error in the job."""
        ring = self._rings.get(name)
        if ring is not None:
            return ring
        with self._making:
            ring = self._rings.get(name)
            if ring is None:
                stop = functools.partial(self._stopped, RING_PROBES.get(name, name),
                                         f"{name}.ring")
                try:
                    ring = self.writer.ring(name, fmt, names, RING_CAPACITY, on_stop=stop)
                except OSError as err:
                    ring = RingWriter.unavailable(fmt, names, err)
                    stop(err)
                self._rings[name] = ring
            return ring

    def update_meta(self, **values: Any) -> None:
        self._meta.update(values)
        try:
            self.writer  # noqa: B018  (made on first use, writing the meta)
        except OSError as err:
            self._stopped("recording", "process folder", err)
            return
        self._save_meta()

    def trace_path(self, window: int = 1) -> Path:
        return self.writer.trace_path(window)

    def export_trace(self, export: Callable[[str], Any], window: int = 1) -> None:
        """Have ``export`` write the ``window``-th profiler window's trace into the process
        folder (through a fresh file, doctor.store.process); ``OSError`` (said in the status)
        when it could not be written whole."""
        try:
            self.writer.export_trace(export, window)
        except OSError as err:
            self._stopped("torch_ops", layout.TRACE, err)
            raise

    def record_memory(self, row: dict[str, Any]) -> None:
        if layout.MEMORY in self._meta.get("stopped", {}):
            return
        try:
            self.writer.append_memory(row)
        except OSError as err:
            self._stopped("memory", layout.MEMORY, err)

    def _save_meta(self) -> None:
        """Write meta.json as it is now; a failed write (a full disk) is retried with the next
        (the meta stays whole in memory meanwhile, and the rings say why they stopped)."""
        if self._writer is not None:
            try:
                self._writer.write_meta(self._meta)
            except OSError:
                pass

    def _stopped(self, probe: str, what: str, err: OSError) -> None:
        """A write of ``probe`` (to ``what``) failed: it records no more there; said once, in
        its status and the meta's ``stopped``, for the report's probe table."""
        stopped = self._meta.setdefault("stopped", {})
        if what in stopped:
            return
        reason = f"stopped: {write_error(err)} ({what})"
        stopped[what] = reason
        self.probe_status[probe] = {"ok": False, "reason": reason, "hint": STOPPED_HINT}
        self._meta["probes"] = self.probe_status
        self._save_meta()

    def swallowed(self, probe: str, what: str, err: BaseException) -> None:
        """``what`` of ``probe`` raised ``err``, caught so that the job goes on: the probe's
        first such failure becomes its status's reason (doctor.record.guard), in the meta at
        once where the process folder exists. Never raises."""
        try:
            before = ProbeStatus(**self.probe_status.get(probe, {"ok": True}))
            after = degraded(before, what, err)
            if after is not before:
                self.probe_status[probe] = after.to_dict()
                self._meta["probes"] = self.probe_status
                self._save_meta()
        except Exception:  # the guard never raises into the job; nothing is left to say it
            pass

    # ----- hot path ----------------------------------------------------------------------
    def mark_step(self, kind: int, key: int = 0) -> None:
        """A step boundary seen now (end of a step)."""
        if self.closed:
            return
        ring = self._rings.get("steps") or self.ring("steps", *STEPS_RECORD)
        ring.write(self.clock(), kind, key)
        self.count_step(kind, key)

    def record_optimizer_start(self) -> None:
        self._opt_t0 = self.clock()

    def record_optimizer_end(self, key: int) -> None:
        if self.closed:
            return
        t1 = self.clock()
        ring = self._rings.get("optimizer") or self.ring("optimizer", *INTERVAL_RECORD)
        ring.write(self._opt_t0, t1, key)
        self.count_step(STEP_OPTIMIZER, key)

    def record_interval(self, name: str, t0: int, t1: int, key: int = 0) -> None:
        """An interval such as one DataLoader wait or one backward call."""
        if self.closed:
            return
        ring = self._rings.get(name) or self.ring(name, *INTERVAL_RECORD)
        ring.write(t0, t1, key)

    def record_event(self, event: int, value: int = 0) -> None:
        self.ring("events", *EVENT_RECORD).write(self.clock(), event, value)

    def record_graph_replay(self, t0: int) -> None:
        """A CUDA graph replay that began at ``t0`` ended now."""
        if self.closed:
            return
        ring = self._rings.get("graph_replay") or self.ring("graph_replay", *INTERVAL_RECORD)
        ring.write(t0, self.clock(), 0)
        self.count_step(STEP_GRAPH)

    def count_step(self, kind: int, key: int = 0) -> None:
        """A step boundary of ``kind`` (from optimizer ``key``) was seen: when it counts
        (doctor.record.step_count), tell the step listeners the count."""
        count = self._counter.saw(kind, key)
        if count is None:
            return
        self._run_steps.saw(self.clock(), self._counter.kind, count == 1)
        for listener in self._step_listeners:
            listener(count)

    def _write_run_steps(self, *values: int) -> None:
        self.ring("run_steps", *RUN_STEPS_RECORD).write(*values)

    # ----- listeners ----------------------------------------------------------------------
    def on_step(self, callback: Callable[[int], None]) -> None:
        self._step_listeners = (*self._step_listeners, callback)

    def off_step(self, callback: Callable[[int], None]) -> None:
        """Stop calling ``callback`` (safe from inside it: a count goes to the listeners of the
        moment it was made)."""
        self._step_listeners = tuple(c for c in self._step_listeners if c != callback)

    def on(self, event: str, callback: Callable[[], None]) -> None:
        self._listeners.setdefault(event, []).append(callback)

    def emit(self, event: str) -> None:
        for callback in list(self._listeners.get(event, ())):
            callback()

    # ----- optimizers seen -----------------------------------------------------------------
    def saw_optimizer(self, optimizer: Any) -> None:
        """An optimizer stepped for the first time (the steps probe calls this once for each):
        kept weakly, for what measures the model's state (doctor.probes.model_state)."""
        try:
            self._optimizers.append(weakref.ref(optimizer))
        except TypeError:  # an object that takes no weak reference: not kept
            pass

    @property
    def optimizers(self) -> list[Any]:
        """The optimizers seen stepping that are still alive, first seen first."""
        return [o for o in (r() for r in self._optimizers) if o is not None]

    # ----- settings seen ------------------------------------------------------------------
    def record_loader(self, settings: dict[str, Any]) -> int:
        """Remember a DataLoader's settings; returns a small id for its wait records."""
        key = tuple(sorted(settings.items()))
        loader_id = self._loaders.get(key)
        if loader_id is None:
            loader_id = len(self._loaders)
            self._loaders[key] = loader_id
            loaders = self._meta.get("loaders", [])
            self.update_meta(loaders=[*loaders, {"id": loader_id, **settings}])
        return loader_id

    def record_batch_tensors(self, loader_id: int, tensors: int) -> None:
        """How many tensors a batch of this loader holds (counted once per loader)."""
        counts = self._meta.get("batch_tensors", {})
        if str(loader_id) not in counts:
            self.update_meta(batch_tensors={**counts, str(loader_id): tensors})

    # ----- lifecycle ----------------------------------------------------------------------
    def forked(self) -> None:
        """In a forked child: forget the parent's files and probes, record into our own."""
        self.pid = os.getpid()
        self.started_ns = self.clock()
        self._reset()
        self.role = "child"
        allow_parent_tracer()  # prctl is per process: name it again

    def close(self) -> None:
        if self.closed:
            return
        self.emit(CLOSE)
        self._run_steps.flush()
        self.closed = True
        if self._writer is not None:
            self._meta["ended_ns"] = self.clock()
            self._meta["rings"] = {k: r.written for k, r in self._rings.items()}
            self._meta["probes"] = self.probe_status
            self._meta.update(cuda_device())
            self._save_meta()
            self._writer.close()
        for ring in self._rings.values():
            ring.close()


def write_error(err: OSError) -> str:
    """An error of a write as the probe table says it: "no space left on device"."""
    text = err.strerror or str(err) or type(err).__name__
    return text[:1].lower() + text[1:]
