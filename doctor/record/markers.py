"""``doctor.step()``: an explicit step boundary for custom loops. A no-op without a session."""

from __future__ import annotations

from . import session as _session


def step() -> None:
    """Mark the end of one training step (use when doctor cannot see your loop's steps)."""
    current = _session.current()
    if current is not None:
        current.mark_step(_session.STEP_MANUAL)
