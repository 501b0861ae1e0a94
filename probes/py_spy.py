"""py-spy itself, as the stacks probe (doctor.probes.stacks) uses it: where it is, whether it
may read and pause the job's processes (checked before any window opens, on a throwaway process
set up as the job's are), and what to say when it cannot, each case with its own reason and
hint: missing (install it), refused at reading (``dump``: ptrace), refused at pausing
(``record``: ptrace attach, which a policy may refuse where reading is allowed), or failed.
py-spy's own words are kept, without the Rust backtrace it may append.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from ..record.tracer import PR_SET_PTRACER

PTRACE_HINT = ("py-spy needs ptrace: run the container with --cap-add SYS_PTRACE, or set "
               "kernel.yama.ptrace_scope=0; doctor fell back to an in-process sampler")
RECORD_HINT = ("py-spy record pauses each process through ptrace (attach): run the container "
               "with --cap-add SYS_PTRACE, or set kernel.yama.ptrace_scope=0; doctor fell back "
               "to an in-process sampler")
MISSING_HINT = "pip install py-spy; doctor fell back to an in-process sampler"
FAILED_HINT = "doctor fell back to an in-process sampler"


def find_py_spy() -> str | None:
    """The py-spy on PATH (the user's choice, as a shell would find it), else where pip put it:
    beside the running interpreter's scripts (a venv's bin, run as .venv/bin/doctor without
    the venv on PATH)."""
    import sysconfig

    on_path = shutil.which("py-spy")
    if on_path:
        return on_path
    names = ("py-spy.exe", "py-spy") if os.name == "nt" else ("py-spy",)
    folders = [Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))]
    for folder in folders:
        for name in names:
            candidate = folder / name
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    return None


def py_spy_error(text: str) -> str:
    """py-spy's own words for an error, without the Rust backtrace it may append: its
    ``Error:`` line and the causes under ``Caused by:``, one line (at most 200 characters)."""
    said: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if line.lower().startswith(("stack backtrace", "backtrace:")):
            break
        if not line or line.startswith(("Caused by:", "note: run with", "at ")) \
                or _BACKTRACE_FRAME.match(line):
            continue
        said.append(line.removeprefix("Error:").strip())
    return "; ".join(said)[:200] or "no message"


_BACKTRACE_FRAME = re.compile(r"^\d+:\s")


def _refused(text: str) -> bool:
    low = text.lower()
    return any(w in low for w in ("permission", "not permitted", "ptrace", "eperm",
                                  "os error 1)", "access denied"))


def record_failure(output: str, returncode: int | None) -> tuple[str, str]:
    """(reason, hint) for a ``py-spy record`` that failed: refused (ptrace attach) or not."""
    said = py_spy_error(output)
    if _refused(output):
        return f"py-spy record was refused: {said}", RECORD_HINT
    return f"py-spy record failed (exit status {returncode}): {said}", FAILED_HINT


def py_spy_refusal(py_spy: str, parent_pid: int, timeout: float = 10.0,
                   stop: threading.Event | None = None) -> tuple[str, str] | None:
    """Try py-spy on a throwaway process set up as the job's are, as it will read them: a
    ``dump`` (reading its memory), then a short blocking ``record`` (pausing it: ptrace
    attach, which a policy may refuse where reading is allowed). None when both work (or
    ``stop`` was set: the run ended first), else (reason, hint).

    The job's processes name the doctor parent as their tracer (PR_SET_PTRACER), so a refusal
    here means the same refusal there: a container without SYS_PTRACE, or Yama scope 2-3.
    """
    import tempfile

    try:
        target = _throwaway(parent_pid)
    except OSError as err:
        return f"py-spy could not be tried: {err}", FAILED_HINT
    try:
        rc, said = _ask([py_spy, "dump", "--nonblocking", "--pid", str(target.pid)],
                        timeout, stop)
        if rc is None and said == _STOPPED:
            return None
        if rc != 0:
            return f"ptrace refused: {py_spy_error(said)}", PTRACE_HINT
        with tempfile.TemporaryDirectory(prefix="doctor-py-spy-") as tmp:
            output = Path(tmp) / "stacks.txt"
            rc, said = _ask([py_spy, "record", "--pid", str(target.pid), "--rate", "20",
                             "--duration", "1", "--idle", "--threads", "--format", "raw",
                             "--output", str(output)], timeout, stop)
            if (rc == 0 and output.is_file()) or said == _STOPPED:
                return None
        return record_failure(said, rc)
    finally:
        target.kill()
        target.wait()


_STOPPED = "stopped: the run ended first"


def _ask(cmd: list[str], timeout: float, stop: threading.Event | None
         ) -> tuple[int | None, str]:
    """(exit status, what it said on stdout and stderr) of ``cmd``; (None, why) where it did
    not answer within ``timeout`` or could not start, (None, _STOPPED) where ``stop`` was set
    first (it is killed then)."""
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
    except OSError as err:
        return None, f"py-spy did not start: {err}"
    deadline = time.monotonic() + timeout
    while True:
        try:
            out, _ = proc.communicate(timeout=0.1)
            return proc.returncode, out or ""
        except subprocess.TimeoutExpired:
            if stop is not None and stop.is_set():
                why = _STOPPED
            elif time.monotonic() > deadline:
                why = f"py-spy did not answer in {timeout:.0f} s"
            else:
                continue
        proc.kill()
        proc.communicate()
        return None, why


def _throwaway(parent_pid: int) -> subprocess.Popen[bytes]:
    """A Python process that names ``parent_pid`` its tracer, as the job's do, and waits."""
    target = subprocess.Popen(
        [sys.executable, "-c",
         "import ctypes, sys, time\n"
         f"ctypes.CDLL(None).prctl({PR_SET_PTRACER}, {parent_pid}, 0, 0, 0)\n"
         "sys.stdout.write('ready\\n'); sys.stdout.flush(); time.sleep(30)\n"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert target.stdout is not None
    target.stdout.readline()
    return target


__all__ = ["FAILED_HINT", "MISSING_HINT", "PTRACE_HINT", "RECORD_HINT", "find_py_spy",
           "py_spy_error", "py_spy_refusal", "record_failure"]
