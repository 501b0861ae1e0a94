"""Naming the ``doctor run`` process as this process's tracer, so that its py-spy may attach.

Under Yama ``ptrace_scope=1`` a process may be traced only by its ancestors, or by the process it
names with ``prctl(PR_SET_PTRACER, pid)``. The job's processes are children of ``doctor run``, but
py-spy is a child of ``doctor run`` too, not an ancestor: each process of the job names the parent
(whose children py-spy runs as). The setting is per process, so a forked child names it again.
"""

from __future__ import annotations

import os
import sys

ENV_PARENT_PID = "DOCTOR_PARENT_PID"  # the doctor run process, whose py-spy may trace us
PR_SET_PTRACER = 0x59616D61


def allow_tracer(parent_pid: int) -> None:
    """Let ``parent_pid`` (and so its py-spy children) trace this process (Linux, Yama)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PTRACER, parent_pid, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def allow_parent_tracer() -> None:
    """Name the doctor parent (``DOCTOR_PARENT_PID``) as our tracer, when there is one."""
    parent = os.environ.get(ENV_PARENT_PID, "")
    if parent.isdigit():
        allow_tracer(int(parent))
