"""The child processes an uncaught exception was about: which of them a signal killed.

When a DataLoader worker dies by a signal (the OOM killer's SIGKILL), the training process
usually learns it from ``Process.is_alive()``, which reaps the worker, and raises "DataLoader
worker (pid(s) N) exited unexpectedly". The ``doctor run`` parent watches each process
through a pidfd and reads a zombie's wait status, but on a loaded machine the training process
can reap the worker first, and the status is gone. The training process itself still holds it:
each ``multiprocessing`` Process object keeps its ``returncode`` (minus the signal's number).
The excepthook looks through the frames of the exception's traceback for Process objects (a
local such as torch's ``failed_workers``, or the ``_workers`` of a frame's ``self``) and keeps
those a signal ended. Only what is already in memory is read: no process is waited on or
polled (``exitcode`` would poll, and reap).
"""

from __future__ import annotations

from collections.abc import Iterator
from types import TracebackType
from typing import Any

MAX_FRAMES = 200  # a deep recursion's traceback is not walked to its end
MAX_ITEMS = 1024  # nor a long list looked through


def killed_children(exc: BaseException | None) -> list[dict[str, int]]:
    """``[{"pid": P, "signal": S}]`` for each multiprocessing Process that the frames of
    ``exc``'s traceback (and of the exceptions it was raised from) hold and a signal ended;
    empty when multiprocessing was never imported or anything is odd."""
    import sys
    if "multiprocessing.process" not in sys.modules:
        return []
    base = sys.modules["multiprocessing.process"].BaseProcess
    found: dict[int, int] = {}
    try:
        for value in _frame_values(exc):
            for proc in _processes(value, base):
                popen = getattr(proc, "_popen", None)
                code = getattr(popen, "returncode", None)
                pid = getattr(popen, "pid", None)
                if isinstance(code, int) and code < 0 and isinstance(pid, int):
                    found[pid] = -code
    except Exception:  # the job's own traceback matters more than this
        return []
    return [{"pid": pid, "signal": sig} for pid, sig in found.items()]


def _frame_values(exc: BaseException | None) -> Iterator[Any]:
    seen: set[int] = set()
    frames = 0
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        tb: TracebackType | None = exc.__traceback__
        while tb is not None and frames < MAX_FRAMES:
            frames += 1
            local = tb.tb_frame.f_locals
            yield from list(local.values())
            this = local.get("self")
            if this is not None:
                yield getattr(this, "_workers", None)
            tb = tb.tb_next
        exc = exc.__cause__ or exc.__context__


def _processes(value: Any, base: type) -> list[Any]:
    if isinstance(value, base):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value[:MAX_ITEMS] if isinstance(v, base)]
    return []


__all__ = ["killed_children"]
