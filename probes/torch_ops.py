"""torch_ops probe: torch.profiler over a bounded window of steady steps (the deep window).

The profiler runs only from step ``start`` for ``steps`` steps (never always on: it costs
1.06-1.2x a step and its memory grows every step). Each step inside the window is marked with
``prof.step()`` so the Kineto trace has one ProfilerStep#N per training step. The trace is
exported as plain JSON on the training thread when the window closes; whoever finalises the
run directory gzips it.
"""

from __future__ import annotations

from typing import Any

from doctor.probes.stacks import fallback_requested, start_fallback_sampler
from doctor.record.session import (
    EVENT_WINDOW_START,
    EVENT_WINDOW_STOP_BEGIN,
    EVENT_WINDOW_STOP_END,
    Session,
)
from doctor.verdict import ProbeStatus

TRACE_NAME = "trace.json"

IDLE, ACTIVE, DONE, FAILED = "idle", "active", "done", "failed"


class DeepWindow:
    name = "torch_ops"

    def __init__(self, session: Session, start: int = 8, steps: int = 5) -> None:
        self.session = session
        self.start_at = max(1, start)
        self.steps = max(1, steps)
        self.state = IDLE
        self._prof: Any = None
        self._opened_at = 0

    def check(self) -> ProbeStatus:
        try:
            import torch.profiler  # noqa: F401
        except ImportError as err:
            return ProbeStatus(False, f"torch.profiler unavailable ({err})", "")
        return ProbeStatus(True)

    def on_step(self, count: int) -> None:
        """Called by the Session at each step boundary with the steady-step count."""
        if self.state == IDLE and count >= self.start_at:
            self._open(count)
        elif self.state == ACTIVE:
            if count - self._opened_at >= self.steps:
                self._close()
            else:
                try:
                    self._prof.step()
                except Exception as err:
                    self._fail(err)

    def _open(self, count: int) -> None:
        try:
            import torch
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(ProfilerActivity.CUDA)
            self._prof = profile(activities=activities, record_shapes=False,
                                 profile_memory=False, with_stack=False)
            self.session.record_event(EVENT_WINDOW_START, count)
            if fallback_requested(self.session.run_dir):
                start_fallback_sampler(self.session.directory)
            self._prof.start()
            if self.session.memory is not None:
                self.session.memory.snapshot("window_start")
            self.state = ACTIVE
            self._opened_at = count
            self.session.update_meta(window={"state": ACTIVE, "start_step": count,
                                             "steps": self.steps,
                                             "cuda": "CUDA" in str(activities)})
        except Exception as err:
            self._fail(err)

    def _close(self) -> None:
        try:
            self.session.record_event(EVENT_WINDOW_STOP_BEGIN, 0)
            self._prof.stop()
            self._prof.export_chrome_trace(str(self.session.directory / TRACE_NAME))
            self.session.record_event(EVENT_WINDOW_STOP_END, 0)
            if self.session.memory is not None:
                self.session.memory.snapshot("window_end")
            self.state = DONE
            self.session.update_meta(window={**self.session._meta.get("window", {}),
                                             "state": DONE})
        except Exception as err:
            self._fail(err)
        finally:
            self._prof = None

    def _fail(self, err: BaseException) -> None:
        self.state = FAILED
        try:
            if self._prof is not None:
                self._prof.stop()
        except Exception:  # already failing; the reason below is what the user needs
            pass
        self._prof = None
        try:
            self.session.update_meta(window={"state": FAILED,
                                             "reason": f"{type(err).__name__}: {err}"})
        except OSError:
            pass

    def close(self) -> None:
        """At exit inside an open window: keep what was recorded so far."""
        if self.state == ACTIVE:
            self._close()
