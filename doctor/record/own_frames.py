"""doctor's own frames out of the job's tracebacks.

The probes wrap functions the job calls (a DataLoader's ``__next__``, a worker's ``fetch``, an
optimizer's ``step``): an exception raised beneath one passes through doctor's wrapper, and the
traceback the job prints would hold a frame of ``probes/dataloader.py`` the job never wrote.
Python cannot hide a frame as an exception passes, but a traceback's links can be rewritten
before it is printed: the excepthook (doctor.bootstrap) hands the job's previous hook the
traceback without doctor's frames, and a DataLoader worker's exception is formatted by torch's
``ExceptionWrapper`` (in the worker, into the text the main process prints as "Original
Traceback") from a traceback rewritten the same way (probes/dataloader.py). The exception and
those it was raised from or during (``__cause__``, ``__context__``) are rewritten alike. Only
frames of doctor's own packages that the exception passed through go (one raised in doctor's
code stays, where it was raised); the job's, torch's and the library's stay in their order.
"""

from __future__ import annotations

import os
from types import TracebackType


def _own_dirs() -> tuple[str, ...]:
    """The folders whose frames are doctor's: its package's, and its probes' where they live
    apart (a source checkout's ``probes/`` beside ``doctor/``, named by the launcher's
    DOCTOR_PROBES_DIR or found there, and only if it is doctor's: never another package of
    that name beside an installed doctor)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # doctor/
    probes = os.environ.get("DOCTOR_PROBES_DIR") or os.path.join(os.path.dirname(here), "probes")
    probes = os.path.abspath(probes)
    doctors = os.path.isfile(os.path.join(probes, "torch_ops.py")) and \
        os.path.isfile(os.path.join(probes, "dataloader.py"))
    if doctors and not (probes + os.sep).startswith(here + os.sep):
        return (here + os.sep, probes + os.sep)
    return (here + os.sep,)


OWN_DIRS = _own_dirs()
MAX_LINKS = 10_000  # a deep recursion's traceback is rewritten this far


def is_own(tb: TracebackType) -> bool:
    """A frame of doctor's that the exception passed through (a wrapper): not the innermost,
    where it was raised (an error of doctor's own stays shown where it happened)."""
    return tb.tb_next is not None and tb.tb_frame.f_code.co_filename.startswith(OWN_DIRS)


def without_own_frames(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` with doctor's frames unlinked (the traceback objects are relinked in place)."""
    while tb is not None and is_own(tb):
        tb = tb.tb_next
    head, links = tb, 0
    while tb is not None and links < MAX_LINKS:
        nxt = tb.tb_next
        while nxt is not None and is_own(nxt):
            nxt = nxt.tb_next
        if nxt is not tb.tb_next:
            tb.tb_next = nxt
        tb, links = nxt, links + 1
    return head


def exception_without_own_frames(exc: BaseException | None) -> None:
    """``exc``'s traceback, and those of the exceptions it was raised from or during, without
    doctor's frames; never raises."""
    seen: set[int] = set()
    todo = [exc]
    while todo and len(seen) < MAX_LINKS:
        exc = todo.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        try:
            exc.__traceback__ = without_own_frames(exc.__traceback__)
            todo += [exc.__cause__, exc.__context__]
        except Exception:  # an exception of an odd kind: its traceback stays as it was
            continue


__all__ = ["OWN_DIRS", "exception_without_own_frames", "is_own", "without_own_frames"]
