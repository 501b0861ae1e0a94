"""The guard around a measurement: a failure never reaches the job, and never goes unsaid.

A probe that catches an error so that the job goes on (``except Exception``) hands it here from
its ``except`` branch, so the success path costs nothing (no call, no context manager per step).
The first failure of a probe becomes the reason of its status, shown in the report's probe table
with GUARD_HINT; the probe goes on, and its ``ok`` stays what it was (it still measures the
rest). Later failures add nothing: the first says why. A probe that is already off, or already
said a failure (a write that stopped it: doctor.record.session), keeps its reason.

In the job the Session keeps the statuses (``Session.swallowed``); a probe of the ``doctor run``
parent keeps its own ProbeStatus, through ``degraded``.
"""

from __future__ import annotations

from ..verdict import ProbeStatus

GUARD_HINT = ("the job was not affected; the probe went on without that part (its first "
              "failure is shown)")
REASON_CHARS = 300  # an error's message can be long (a tensor's repr): the table keeps a line


def failure_reason(what: str, err: BaseException) -> str:
    """"<what> failed: <type>: <message>", at most REASON_CHARS characters."""
    try:
        said = f"{type(err).__name__}: {err}"
    except Exception:  # an exception whose str() raises: its type is what can be said
        said = type(err).__name__
    return f"{what} failed: {said}"[:REASON_CHARS]


def degraded(status: ProbeStatus, what: str, err: BaseException) -> ProbeStatus:
    """``status`` of a probe that went on after ``what`` raised ``err``: that failure as its
    reason, ``ok`` unchanged; ``status`` itself where it is off or already said a failure."""
    if not status.ok or status.hint == GUARD_HINT:
        return status
    return ProbeStatus(status.ok, failure_reason(what, err), GUARD_HINT)
