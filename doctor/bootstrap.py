"""Start a Session in a process of the job (under ``doctor run``) or in the caller (watch).

The job-side probes of the registry (doctor.probes.REGISTRY) start as soon as torch is imported:
if it already is, now; otherwise a one-shot import hook runs them right after ``import torch``
finishes, so doctor never imports torch into a process that does not use it, nor changes the
job's import order. Which probes ran, and why the others did not, goes to the process's meta.
"""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .record import session as session_mod
from .record.after_import import when_imported
from .record.session import Session
from .record.tracer import allow_parent_tracer
from .record.window import DEFAULT_WINDOW, Window, window_in_job

if TYPE_CHECKING:

    from .record import overrides

ENV_RUN_DIR = "DOCTOR_RUN_DIR"
ENV_TRY_APPLY = "DOCTOR_TRY_APPLY"  # overrides.ENV_APPLY: the settings a try changes
ENV_TRY_STOP = "DOCTOR_STOP_AFTER"  # stop.ENV_STOP_AFTER: a try's stop after N steps


def start_from_env() -> Session | None:
    run_dir = os.environ.get(ENV_RUN_DIR)
    if not run_dir:
        return None
    window = window_in_job(os.environ)  # validated by the parent; never raises
    allow_parent_tracer()
    probes = start_session(Path(run_dir), window=window, tried=True)
    atexit.register(probes.close)
    _note_uncaught_exceptions(probes.session)
    return probes.session


def _note_uncaught_exceptions(session: Session) -> None:
    """Record in the process's meta an exception that ends it (which rank failed, and why),
    then hand it to the hook that was there before, its traceback without doctor's wrappers
    (doctor.record.own_frames): the job prints what it always printed."""
    previous = sys.excepthook

    def hook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        try:
            if session.recording:
                from .record.killed_children import killed_children
                session.update_meta(crashed=f"{exc_type.__name__}: {exc}"[:500],
                                    crashed_ns=session.clock(),
                                    crashed_children=killed_children(exc))
        except Exception:  # the job's own traceback matters more than our note
            pass
        if exc is not None:  # the job's traceback as the job would print it
            from .record.own_frames import exception_without_own_frames
            exception_without_own_frames(exc)
            tb = exc.__traceback__
        previous(exc_type, exc, tb)

    sys.excepthook = hook


def start_session(run_dir: Path, *, window: Window = DEFAULT_WINDOW,
                  tried: bool = False) -> JobProbes:
    """Install a Session for this process; its probes start with (or after) torch. With
    ``tried`` (under ``doctor run`` and ``doctor try``), the settings of a try and its stop
    after N steps come from the environment (doctor.record.overrides, doctor.record.stop)."""
    session = session_mod.install(
        Session(run_dir, window_start=window.start, window_steps=window.steps))
    starter = JobProbes(session)
    if tried:
        _tried_settings(starter)
    when_imported("torch", starter.start)
    return starter


def _tried_settings(starter: JobProbes) -> None:
    """The settings of a ``doctor try`` and its stop after N steps (imported only then: a
    process that runs no try pays nothing for them)."""
    if any(os.environ.get(name) for name in (ENV_TRY_APPLY, ENV_TRY_STOP)):
        from .record import overrides, stop

        starter.overrides = overrides.from_env(starter.session)
        stop.from_env(starter.session)


class JobProbes:
    """Starts the job-side probes of the registry once; records which ran and why others did
    not."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.probes: list[Any] = []
        self.overrides: overrides.Overrides | None = None

    def start(self) -> None:
        from .probes import JOB, probes_of

        if self.overrides is not None:  # the settings a try changes come before user code
            self.overrides.start()
        # the Session's own from here: what a probe's start swallowed (Session.swallowed) stays
        status: dict[str, dict[str, Any]] = {}
        self.session.probe_status = status
        for spec in probes_of(JOB):
            try:
                probe = spec.create(self.session)
                ok = probe.check()
                status[spec.name] = ok.to_dict()
                if ok.ok:
                    probe.start()
                    self.probes.append(probe)
            except Exception as err:
                status[spec.name] = {"ok": False,
                                     "reason": f"failed to start: {type(err).__name__}: {err}"}

    def close(self) -> None:
        self.session.close()  # the window exports, the allocator takes its exit snapshot
        for probe in self.probes:
            try:
                probe.stop()
            except Exception:  # at exit, a probe that cannot unpatch is harmless
                pass
        self.probes = []
        if self.overrides is not None:
            self.overrides.stop()
        session_mod.uninstall(self.session)
