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
``doctor run`` the job is already recorded, so watch then does nothing.
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

from doctor.record import session as session_mod
from doctor.verdict import ProbeStatus

F = TypeVar("F", bound=Callable[..., Any])
HOST_INTERVAL_S = 1.0
WATCH_NO_GPU = ProbeStatus(False, "doctor.watch does not sample the GPU",
                           "doctor run samples it from outside the job: doctor run train.py")


class watch:  # lower case: used as a decorator, named like one
    def __init__(self, func: Callable[..., Any] | None = None, *,
                 out: str | os.PathLike[str] | None = None, window: str = "8,5",
                 report: bool = True) -> None:
        if func is not None and not callable(func):
            raise TypeError(
                "doctor.watch takes keyword arguments: use doctor.watch(out="
                f"{func!r}), not doctor.watch({func!r})")
        self._func = func
        self.out = Path(out) if out is not None else None
        self.window = window
        self.report = report
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
            return watch(args[0], out=self.out, window=self.window, report=self.report)
        with watch(out=self.out, window=self.window, report=self.report) as w:
            result = self._func(*args, **kwargs)
        self.run_dir = w.run_dir
        return result

    def __enter__(self) -> watch:
        if session_mod.current() is not None:
            return self  # doctor run (or an outer watch) already records this process
        name = getattr(self._func, "__name__", None) or Path(sys.argv[0] or "watch").stem
        self._active = _WatchRun.start(self.out, name, self.window)
        self.run_dir = self._active.run_dir
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        active, self._active = self._active, None
        if active is not None:
            active.finish(failed=exc_type is not None, report=self.report,
                          interrupted=exc_type is KeyboardInterrupt)


class _WatchRun:
    """The pieces of one watched run: session, in-process host sampler, run record."""

    def __init__(self, run_dir: Path, probes: Any, sampler: Any, started: float,
                 t0: float) -> None:
        self.run_dir = run_dir
        self.probes = probes
        self.sampler = sampler
        self.started = started
        self.t0 = t0
        self._stop = threading.Event()
        self.failed: ProbeStatus | None = None
        self._thread = threading.Thread(target=self._sample, name="doctor-host", daemon=True)

    @classmethod
    def start(cls, out: Path | None, name: str, window: str) -> _WatchRun:
        from doctor.launch import QUIET_KINETO, run_record
        from doctor.probes.host import HostSampler
        from doctor.probes.stacks import request_in_process_stacks
        from doctor.record.bootstrap import parse_window, start_session
        from doctor.store.rundir import new_run_dir, write_run_record

        run_dir = new_run_dir(out, name)
        os.environ.setdefault("KINETO_LOG_LEVEL", QUIET_KINETO)
        request_in_process_stacks(run_dir, "doctor.watch samples its own process")
        started, t0 = time.time(), time.monotonic()
        write_run_record(run_dir, run_record(list(sys.argv), name, started, t0,
                                             exit_code=None, mode="watch"))
        start, steps = parse_window(window)
        probes = start_session(run_dir, window_start=start, window_steps=steps)
        sampler = HostSampler(os.getpid(), run_dir=run_dir, t0=t0)
        run = cls(run_dir, probes, sampler, started, t0)
        if sampler.check().ok:
            sampler.start()
            run._thread.start()
        return run

    def _sample(self) -> None:
        while not self._stop.wait(HOST_INTERVAL_S):
            try:
                self.sampler.sample()
            except Exception as err:  # the host probe must never disturb the job
                self.failed = ProbeStatus(False, f"failed while sampling: {type(err).__name__}: "
                                                 f"{err}", "the job was not affected")
                return

    def finish(self, *, failed: bool, report: bool, interrupted: bool) -> None:
        from doctor.launch import run_record
        from doctor.store.rundir import report_path, write_run_record

        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * HOST_INTERVAL_S)
        self.probes.close()
        try:
            self.sampler.stop()
            host = self.failed or self.sampler.check()
            probes = {"host": host.to_dict(), "gpu": WATCH_NO_GPU.to_dict(),
                      "stacks": {"ok": True, "reason": "in-process sampler (doctor.watch)"}}
            exit_code = 130 if interrupted else 1 if failed else 0
            write_run_record(self.run_dir, run_record(
                list(sys.argv), self.run_dir.name, self.started, self.t0,
                exit_code=exit_code, duration_s=time.monotonic() - self.t0, probes=probes,
                mode="watch"))
            if report:
                from doctor.outputs import finalize_run
                from doctor.reports.text import headline

                analysis = finalize_run(self.run_dir)
                sys.stderr.write(f"doctor: {headline(analysis.verdict)}; report: "
                                 f"{report_path(self.run_dir)}\n")
        except Exception as err:  # never mask the job's own result or exception
            sys.stderr.write(f"doctor: could not write the report in {self.run_dir}: "
                             f"{type(err).__name__}: {err}\n")
