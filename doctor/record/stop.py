"""Inside a job run by ``doctor try``: end it cleanly after N steps.

At the N-th step boundary (the Session's count, of the strongest kind of boundary it has seen),
the training process notes the stop in its meta (``stopped_at_step``) and raises SystemExit(0)
from the step hook: the job's ``finally`` blocks and ``with`` exits run, its DataLoader workers
shut down as at any exit, and every torchrun rank stops at the same step, each by its own count.
A job that swallows the exit and trains on is stopped harder a few steps later: the Session
is closed (its records kept) and the process exits at once.
"""

from __future__ import annotations

import os

from .session import Session

ENV_STOP_AFTER = "DOCTOR_STOP_AFTER"
GRACE_STEPS = 3  # steps a job that caught the SystemExit may take before the hard stop


def from_env(session: Session) -> StopAfter | None:
    try:
        steps = int(os.environ.get(ENV_STOP_AFTER, ""))
    except ValueError:
        return None
    if steps < 1:
        return None
    stop = StopAfter(session, steps)
    session.on_step(stop)
    return stop


class StopAfter:
    def __init__(self, session: Session, steps: int) -> None:
        self.session = session
        self.steps = steps

    def __call__(self, count: int) -> None:
        if count < self.steps:
            return
        session = self.session
        if count == self.steps:
            try:
                session.update_meta(stopped_at_step=count, stopped_ns=session.clock())
            except OSError:
                pass
        if count >= self.steps + GRACE_STEPS:
            session.close()
            os._exit(0)
        raise SystemExit(0)
