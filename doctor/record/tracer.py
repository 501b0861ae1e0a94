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
    if not sys.platform.startswith("linux") or _yama_scope() != "1":
        return  # scope 0 lets any process of ours trace; 2 and 3 no naming can change
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PTRACER, parent_pid, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _yama_scope() -> str:
    """Yama's ptrace_scope ("0" to "3"); "0" without Yama (no tracer needs naming then)."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return f.read().strip()
    except OSError:
        return "0"


def allow_parent_tracer() -> None:
    """Name the doctor parent (``DOCTOR_PARENT_PID``) as our tracer, when there is one."""
    parent = os.environ.get(ENV_PARENT_PID, "")
    if parent.isdigit():
        allow_tracer(int(parent))
