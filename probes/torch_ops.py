"""torch_ops probe: torch.profiler over a bounded window of steady steps (the deep window).

The profiler runs only from step ``start`` for ``steps`` steps (never always on: it costs
1.06-1.2x a step and its memory grows every step). The Session counts the steps
(``Session.on_step``); each step inside the window is marked with ``prof.step()`` so the Kineto
trace has one ProfilerStep#N per training step. The trace is exported as plain JSON on the
training thread when the window closes; whoever finalises the run directory gzips it. The
window's state goes to the process's meta.json (what happened, for the analysis) and to the run's
control file (so that ``doctor run`` starts py-spy while it is open).

Later windows: after the first one closes, a drift detector (doctor.record.drift) follows the
steady step time, and where the run slows down for a sustained stretch (or its spikes change) it
opens the window again, with the same settings and steps, within its budget. Each later window
exports its own trace (``trace-N.json``) and is recorded in the meta's ``later_windows``, with
its measured cost; the parent samples its stacks again (py-spy, ``stacks-N.txt``; the in-process
fallback samples beside the first window only), and the memory snapshots stay with the first.
On a GPU a later window starts CUPTI again after Kineto's teardown: it opens only where the
teardown was asked (CUDA 12.6 or newer) or the job's environment chose TEARDOWN_CUPTI itself.

Fork-safe: the window closes by stopping Kineto's config thread (doctor.record.kineto), so a
child forked after it ends as it would without doctor. A fork during the window (from the thread
that profiles) closes the window first, in the parent: the child inherits no profiler, which
would otherwise record its ops for its whole life and crash it at exit, and stopping it in the
child would cost the child the whole window's processing. The window is then shorter, and its
record says so (``closed_by``).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from typing import Any

from ..record.drift import DriftDetector, settings_of
from ..record.kineto import stop_config_thread
from ..record.patches import Patches
from ..record.session import (
    CLOSE,
    EVENT_WINDOW_START,
    EVENT_WINDOW_STOP_BEGIN,
    EVENT_WINDOW_STOP_END,
    WINDOW_END,
    WINDOW_START,
    Session,
)
from ..record.window import OTHER_THREAD, OWN_PROFILER
from ..store.control import post_later_window, post_window
from ..verdict import ProbeStatus
from .job_profilers import watch_job_profilers
from .profiler_activities import (
    ENV_TEARDOWN,
    TEARDOWN_SAFE_FROM,
    ask_cupti_teardown,
    profiler_activities,
)
from .stack_plan import SPAN_S
from .stacks import sample_own_stacks_if_asked

IDLE, ACTIVE, DONE, FAILED = "idle", "active", "done", "failed"
#: Why a window closed (``closed_by`` in its record): its steps were done, the process forked
#: inside it, or the process ended inside it.
BY_STEPS, BY_FORK, BY_EXIT = "steps", "fork", "exit"
BY_JOB = "job_profiler"  # the job made a torch.profiler of its own
#: "off": the window records no input shapes. The ops then have no FLOPs or bytes (no roofline,
#: no MFU), and the closing step is cheaper: stopping the profiler processes every op's shapes,
#: about 2x the stop and export time of a window without them.
ENV_SHAPES = "DOCTOR_SHAPES"


def shapes_wanted(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    return environ.get(ENV_SHAPES, "").strip().lower() not in ("off", "0", "no", "false")


def clock_pair() -> tuple[int, int]:
    """(the session's clock, the Unix clock), in ns, read together: Kineto stamps its events on
    the Unix clock, so this puts the window's events on the clock of the process's rings."""
    before = time.perf_counter_ns()
    unix = time.time_ns()
    return (before + time.perf_counter_ns()) // 2, unix


class DeepWindow:
    name = "torch_ops"

    def __init__(self, session: Session, start: int = 8, steps: int = 5,
                 environ: dict[str, str] | os._Environ[str] = os.environ) -> None:
        self.session = session
        self.start_at = max(1, start)
        self.steps = max(0, steps)
        self.state = IDLE
        self._prof: Any = None
        self._opened_at = 0
        self._count = 0
        self._thread = 0  # the thread that opened the window (the profiler's state is its own)
        self._torch_thread = threading.get_ident()  # the thread that imported torch (start())
        self._record: dict[str, Any] = {}
        self.index = 0  # windows opened so far (the first is 1)
        self._environ = environ
        self._rewindow = settings_of(environ)
        self._user_teardown = ENV_TEARDOWN in environ  # the job chose; doctor did not
        self._teardown = False  # doctor asked Kineto to tear CUPTI down
        self._cuda_windows = 0
        self.drift: DriftDetector | None = None
        self._prev_ns = 0  # the last step boundary before the first window
        self._opened_ns = 0
        self._step_ns = 0  # the step before the first window (its cost's usual step)
        self.later: list[dict[str, Any]] = []  # the later windows' records
        self._patches = Patches()  # the profilers' constructors, watched for the job's own
        self._making = False  # doctor is making its own profiler

    @classmethod
    def for_session(cls, session: Session) -> DeepWindow:
        return cls(session, session.window_start, session.window_steps)

    def check(self) -> ProbeStatus:
        if self.steps == 0:
            return ProbeStatus(False, "the profiler window is off (--window off)",
                               "without it, compute includes the Python between steps and input "
                               "wait is not split by stage")
        try:
            import torch.profiler  # noqa: F401
        except ImportError as err:
            return ProbeStatus(False, f"torch.profiler unavailable ({err})", "")
        return ProbeStatus(True)

    def start(self) -> None:
        self._torch_thread = threading.get_ident()  # called as torch is imported
        self.session.on_step(self.on_step)
        self.session.on(CLOSE, self.close)
        watch_job_profilers(self._patches, lambda: self._making, self.job_profiler)

    def job_profiler(self) -> None:
        """The job made a profiler of its own: an open window closes before it can start, and
        none opens after."""
        try:
            if self.state == ACTIVE and threading.get_ident() == self._thread:
                self._close(BY_JOB)
            if self.state == IDLE:
                self._skip(OWN_PROFILER)
            elif self.drift is not None:
                self._no_more(OWN_PROFILER)
        except Exception as err:  # the job's profiler goes ahead whatever happens here
            self.session.swallowed(self.name, "stepping aside for the job's profiler", err)

    def _skip(self, reason: str) -> None:
        """No window in this process, for ``reason`` (said in its meta and the report)."""
        self.state = FAILED
        self.session.off_step(self.on_step)
        try:
            self._note({"state": FAILED, "reason": reason})
        except OSError:
            pass

    def sample(self) -> None:
        pass  # driven by the Session's step count

    def stop(self) -> None:
        self.close()

    def on_step(self, count: int) -> None:
        """Called by the Session at each step boundary with the steady-step count."""
        self._count = count
        if self.state == DONE:
            drift = self.drift
            if drift is not None and drift.step(self.session.clock()):
                self._open(count)
        elif self.state == IDLE:
            if count >= self.start_at:
                self._open(count)
            else:
                self._prev_ns = self.session.clock()
        elif self.state == ACTIVE:
            if count - self._opened_at >= self.steps:
                self._close()
            else:
                try:
                    self._prof.step()
                except Exception as err:
                    self._fail(err)

    def _open(self, count: int) -> None:
        later = self.index > 0
        if threading.get_ident() != self._torch_thread:
            if later:
                self._no_more(OTHER_THREAD)
            else:
                self._skip(OTHER_THREAD)
            return
        try:
            import torch
            from torch.profiler import profile

            activities = profiler_activities(torch)
            cuda = "CUDA" in str(activities)
            if later and cuda and self._cuda_windows and not (self._teardown
                                                              or self._user_teardown):
                self._no_more("a later window would start CUPTI again without its teardown "
                              f"(CUDA older than {TEARDOWN_SAFE_FROM[0]}.{TEARDOWN_SAFE_FROM[1]}"
                              f", and the job did not set {ENV_TEARDOWN})")
                return
            # shapes: what each op costs (doctor.trace.op_costs); no stacks, no memory events
            shapes = shapes_wanted(self._environ)
            enabled = getattr(getattr(getattr(torch, "_C", None), "_autograd", None),
                              "_profiler_enabled", None)
            if enabled is not None and enabled():  # a profiler doctor did not see made
                self._skip(OWN_PROFILER)
                return
            self._teardown = ask_cupti_teardown(torch, activities, self._environ) \
                or self._teardown
            # self._prof is the profiler once started: stopping one that never started (the
            # run directory full before it) makes torch print a warning into the job's stderr
            self._making = True
            try:
                prof = profile(activities=activities, record_shapes=shapes,
                               profile_memory=False, with_stack=False)
            finally:
                self._making = False
            now = self.session.clock()
            self.index += 1
            self.session.record_event(EVENT_WINDOW_START, count)
            if not later:
                sample_own_stacks_if_asked(self.session)
                self._step_ns = now - self._prev_ns if self._prev_ns else 0
            else:
                self._ask_stacks()
            self._opened_ns = now
            prof.start()
            self._prof = prof
            if not later:
                self.session.emit(WINDOW_START)
            self.state = ACTIVE
            self._opened_at = count
            self._cuda_windows += cuda
            self._thread = threading.get_ident()
            _watch_forks(self)
            self._note({"state": ACTIVE, "start_step": count, "steps": self.steps,
                        "cuda": cuda, "shapes": shapes, "cupti_teardown": self._teardown,
                        "clock": clock_pair(), **self._drift_facts()})
        except Exception as err:
            self._fail(err)

    def _close(self, closed_by: str = BY_STEPS) -> None:
        try:
            self.session.record_event(EVENT_WINDOW_STOP_BEGIN, 0)
            prof, self._prof = self._prof, None  # stopped once: a second stop() (in _fail,
            prof.stop()  # the export failing on a full disk) makes torch warn in the job's stderr
            self.session.export_trace(prof.export_chrome_trace, self.index)
            kineto = self._release()
            self.session.record_event(EVENT_WINDOW_STOP_END, 0)
            if self.index == 1:
                self.session.emit(WINDOW_END)
            self.state = DONE
            profiled = max(0, self._count - self._opened_at)
            cost = self._measure(profiled)
            self._note({**self._record, "state": DONE, "closed_by": closed_by,
                        "steps_profiled": profiled, "kineto_thread": kineto,
                        **({} if cost is None else {"cost_s": cost})})
        except Exception as err:
            self._fail(err)
        finally:
            self._prof = None
            if self.state != DONE or closed_by == BY_EXIT or self.drift is None:
                self.session.off_step(self.on_step)

    def _measure(self, profiled: int) -> float | None:
        """After a window closed: its cost (s), measured by the drift detector, which starts
        one after the first window (where later windows are on) and over after each."""
        if self.drift is None and self.index == 1 and self._rewindow.on:
            self.drift = DriftDetector(self._rewindow, self.session.started_ns)
        if self.drift is None:
            return None
        now = self.session.clock()
        first = self.index == 1
        cost = self.drift.window_done(self._opened_ns, now, profiled, later=not first,
                                      step_ns=self._step_ns if first else None,
                                      span_ns=int(SPAN_S * 1e9))
        return cost / 1e9

    def _ask_stacks(self) -> None:
        """A later window opens: the parent samples its stacks again (stacks-N.txt)."""
        try:
            post_later_window(self.session.run_dir, self.session.rank, self.session.pid,
                              self.index)
        except OSError as err:  # the window goes on without its stacks
            self.session.swallowed("stacks", "asking for a later window's stacks", err)

    def _drift_facts(self) -> dict[str, Any]:
        """What opened a later window: the baseline step and the slow steps in a row."""
        drift = self.drift
        if drift is None or self.index <= 1:
            return {}
        return {"window": self.index, "base_step_s": drift.base_median / 1e9,
                "base_mean_s": drift.base_mean / 1e9, "slow_steps": drift.slow_steps,
                "spent_s": drift.spent_ns / 1e9}

    def _no_more(self, reason: str) -> None:
        """No later window opens in this process (said in its meta)."""
        self.drift = None
        self.session.off_step(self.on_step)
        self.session.update_meta(later_windows_off=reason)

    def _release(self) -> str:
        """After the profiler stopped: leave no Kineto thread behind (what a fork would copy
        half of), and no fork watch."""
        _unwatch_forks(self)
        return stop_config_thread()

    def before_fork(self) -> None:
        """In the parent, just before a fork inside the window: close it here (the child then
        inherits no profiler). A fork from another thread cannot stop this thread's profiler;
        its child inherits none either, and Kineto's thread is stopped for it."""
        if self.state != ACTIVE:
            return
        if threading.get_ident() == self._thread:
            self._close(BY_FORK)
        else:
            stop_config_thread()

    def _note(self, record: dict[str, Any]) -> None:
        self._record = record
        if self.index > 1:  # a later window: its own record; the first's signals stay as they are
            self.later[self.index - 2:] = [record]
            self.session.update_meta(later_windows=list(self.later))
            return
        self.session.update_meta(window=record)
        # closed: the steps it profiled (fewer than planned when a fork or the exit closed it)
        post_window(self.session.run_dir, self.session.rank, self.session.pid, record["state"],
                    steps=record.get("steps_profiled", record.get("steps")),
                    closed_by=record.get("closed_by"), t_s=time.perf_counter())

    def _fail(self, err: BaseException) -> None:
        self.state = FAILED
        try:
            if self._prof is not None:
                self._prof.stop()
        except Exception:  # already failing; the reason below is what the user needs
            pass
        self._prof = None
        self.session.off_step(self.on_step)
        self._release()
        try:
            self._note({**({"window": self.index} if self.index > 1 else {}), "state": FAILED,
                        "reason": f"{type(err).__name__}: {err}"})
        except OSError:
            pass

    def close(self) -> None:
        """At exit inside an open window: keep what was recorded so far. The later windows'
        cost in all (their stack sampling's too) goes to the meta."""
        if self.state == ACTIVE:
            self._close(BY_EXIT)
        self._patches.restore()
        if self.later and self.drift is not None:
            self.session.update_meta(later_windows_spent_s=self.drift.spent_ns / 1e9)


_windows: weakref.WeakSet[DeepWindow] = weakref.WeakSet()
_fork_hook = False


def _watch_forks(window: DeepWindow) -> None:
    """Call ``window.before_fork`` before each fork while it is open."""
    global _fork_hook
    _windows.add(window)
    if not _fork_hook:
        os.register_at_fork(before=_before_fork)
        _fork_hook = True


def _unwatch_forks(window: DeepWindow) -> None:
    _windows.discard(window)


def _before_fork() -> None:
    for window in list(_windows):
        try:
            window.before_fork()
        except Exception as err:  # the job's fork goes ahead whatever happens to the window
            window.session.swallowed(window.name, "closing the window before a fork", err)
