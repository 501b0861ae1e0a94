"""``doctor.watch``: the same Session as ``doctor run``, started from the job's own code.

One object serves every form::

    @doctor.watch
    def train(): ...

    @doctor.watch(out="runs/exp1")
    def train(): ...

    with doctor.watch(out="runs/exp1"):
        train()

The wrapped function's return value and exceptions pass through unchanged. At the end the run
directory gets verdict.json and report.html, and one line on stderr says where. Under
``doctor run`` the job is already recorded, so watch then does nothing. As with ``doctor run``,
an ``out`` holding an earlier run, or one another run is recording into, is refused
(``force=True`` replaces an earlier run): watch says so in one line on stderr and the job runs
on, unrecorded.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from doctor.errors import UsageError
from doctor.record import session as session_mod
from doctor.record.window import DEFAULT_WINDOW, Window, parse_window
from doctor.sampler import ParentSampler

F = TypeVar("F", bound=Callable[..., Any])
TICK_S = 0.5  # the GPU at 2 Hz, as doctor run samples it
EVERY = {"host": 2}  # the host every other tick (1 Hz): it is sampled in the job's own process
SAMPLED = ("host", "gpu")  # the stacks: the in-process sampler (doctor.probes.stacks)
STUCK = "its sampler did not stop in time; its samples were left out"


class watch:  # lower case: used as a decorator, named like one
    def __init__(self, func: Callable[..., Any] | None = None, *,
                 out: str | os.PathLike[str] | None = None,
                 window: Window | str = DEFAULT_WINDOW,
                 report: bool = True, force: bool = False) -> None:
        if func is not None and not callable(func):
            raise TypeError(
                "doctor.watch takes keyword arguments: use doctor.watch(out="
                f"{func!r}), not doctor.watch({func!r})")
        self._func = func
        self.out = Path(out) if out is not None else None
        self.window = window
        self.report = report
        self.force = force
        self.run_dir: Path | None = None
        self._active: _WatchRun | None = None
        if func is not None:
            functools.update_wrapper(self, func)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._func is None:
            # @doctor.watch(out=...) -> wrap the function it decorates
            if len(args) != 1 or kwargs or not callable(args[0]):
                raise TypeError("doctor.watch(...) decorates a function: "
                                "@doctor.watch(out='runs/x') above def train(): ...")
            return watch(args[0], out=self.out, window=self.window, report=self.report,
                         force=self.force)
        with watch(out=self.out, window=self.window, report=self.report,
                   force=self.force) as w:
            result = self._func(*args, **kwargs)
        self.run_dir = w.run_dir
        return result

    def __enter__(self) -> watch:
        if session_mod.current() is not None:
            return self  # doctor run (or an outer watch) already records this process
        name = getattr(self._func, "__name__", None) or Path(sys.argv[0] or "watch").stem
        try:
            self._active = _WatchRun.start(self.out, name, self.window, self.force)
        except (OSError, UsageError) as err:  # the job runs on, unrecorded: doctor never stops it
            from doctor.launch import no_room, no_room_line

            if (full := no_room(err)) is not None:  # no room (a full or read-only disk)
                print(no_room_line(Path(full.filename or self.out or "doctor-runs"), full,
                                   "the job runs without doctor.watch"), file=sys.stderr)
            elif isinstance(err, UsageError):
                sys.stderr.write(f"doctor: {err}; the job runs without doctor.watch\n")
            else:
                raise
            return self
        self.run_dir = self._active.run_dir
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        active, self._active = self._active, None
        if active is not None:
            active.finish(failed=exc_type is not None, report=self.report,
                          interrupted=exc_type is KeyboardInterrupt)


class _WatchRun:
    """The pieces of one watched run: session, the host and GPU samplers (doctor.sampler, in one
    thread beside the job's, as doctor run's parent would sample them), run record."""

    def __init__(self, run_dir: Path, probes: Any, sampler: ParentSampler, started: float,
                 t0: float) -> None:
        self.run_dir = run_dir
        self.probes = probes
        self.sampler = sampler
        self.started = started
        self.t0 = t0
        self._stop = threading.Event()
        self.sampler_cpu_s: float | None = None
        self._thread = threading.Thread(target=self._sample, name="doctor-samplers",
                                        daemon=True)

    @classmethod
    def start(cls, out: Path | None, name: str, window: Window | str, force: bool = False
              ) -> _WatchRun:
        from doctor.bootstrap import start_session
        from doctor.job_record import run_record
        from doctor.launch import QUIET_KINETO
        from doctor.probes import PARENT, ParentContext, probes_of
        from doctor.probes.stacks import request_in_process_stacks
        from doctor.store.rundir import new_run_dir, write_run_record

        # a window it does not take is refused in one line, before the run directory is made
        window = (parse_window(window, option="doctor.watch's window")
                  if isinstance(window, str) else Window(*window))
        run_dir = new_run_dir(out, name, force=force, option="force=True")
        os.environ.setdefault("KINETO_LOG_LEVEL", QUIET_KINETO)
        request_in_process_stacks(run_dir, "doctor.watch samples its own process")
        started, t0 = time.time(), time.monotonic()
        write_run_record(run_dir, run_record(list(sys.argv), name, started, t0,
                                             exit_code=None, mode="watch"))
        probes = start_session(run_dir, window=window)
        sampler = ParentSampler(
            ParentContext(run_dir, os.getpid(), time.monotonic, t0),
            [spec for spec in probes_of(PARENT) if spec.name in SAMPLED],
            interval_s=TICK_S, every=EVERY)
        run = cls(run_dir, probes, sampler, started, t0)
        if sampler.running:
            run._thread.start()
        return run

    def _sample(self) -> None:
        self.sampler.run(lambda seconds: self._stop.wait(seconds) or not self.sampler.running)
        self.sampler_cpu_s = time.thread_time()  # this thread's CPU, for the run record

    def finish(self, *, failed: bool, report: bool, interrupted: bool) -> None:
        from doctor.job_record import RunEnd, run_record
        from doctor.store.rundir import report_path, write_run_record
        from doctor.verdict import ProbeStatus

        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=4 * TICK_S)
        stuck = self._thread.is_alive()  # inside a call that hangs (an NVML call on a bad GPU)
        self.probes.close()
        try:
            status = (self.sampler.abandon(STUCK) if stuck  # stopping would free what it uses
                      else self.sampler.stop())  # each hands its samples to the store
            probes = {**status, "stacks": ProbeStatus(True, "in-process sampler (doctor.watch)")}
            end = RunEnd(130 if interrupted else 1 if failed else 0,
                         time.monotonic() - self.t0, probes, watch=True,
                         sampler_cpu_s=self.sampler_cpu_s)
            write_run_record(self.run_dir, run_record(list(sys.argv), self.run_dir.name,
                                                      self.started, self.t0, **end.to_dict()))
            if report:
                from doctor.outputs import finalize_run
                from doctor.reports.text import headline

                analysis = finalize_run(self.run_dir)
                sys.stderr.write(f"doctor: {headline(analysis.verdict)}; report: "
                                 f"{report_path(self.run_dir)}\n")
        except Exception as err:  # never mask the job's own result or exception
            sys.stderr.write(f"doctor: could not write the report in {self.run_dir}: "
                             f"{type(err).__name__}: {err}\n")
        finally:
            from doctor.store.claim import release_run_dir

            release_run_dir(self.run_dir)
