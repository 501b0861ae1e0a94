"""The profilers the job makes itself, watched so that doctor's window stays out of their way.

Kineto holds one profiler session per process: a window of doctor's beside the job's own
profiler takes its events, and one started inside a scheduled profiler's cycle crashed the job
in the trace export. Each profiler class's constructor (``torch.profiler.profile`` and the
legacy ``torch.autograd.profiler.profile``) is wrapped: one the job makes calls ``on_job``;
doctor's own (``making()`` true) passes, and so does the legacy profiler that torch.profiler
itself makes as each cycle starts (its caller is torch.profiler's own module). Runs inside the
job; the wrappers are put back with ``patches``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from ..record.patches import Patches


def watch_job_profilers(patches: Patches, making: Callable[[], bool],
                        on_job: Callable[[], None]) -> None:
    """Wrap the profilers' constructors (see the module docstring)."""
    try:
        import torch.autograd.profiler as legacy
        import torch.profiler as current
    except ImportError:
        return
    for cls in {getattr(current, "profile", None), getattr(legacy, "profile", None)}:
        init = vars(cls).get("__init__") if isinstance(cls, type) else None
        if init is None:
            continue

        def made(prof: Any, *args: Any, _init: Any = init, **kwargs: Any) -> Any:
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if not making() and not caller.startswith("torch.profiler"):
                on_job()
            return _init(prof, *args, **kwargs)

        patches.put(cls, "__init__", made)
