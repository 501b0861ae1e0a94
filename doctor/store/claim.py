"""One run per run directory: claiming a directory for the run about to record into it.

A run directory holds one run. Claiming it:

- takes its lock (``.doctor.lock``, ``fcntl.flock``) for the life of the claiming process, so
  that a second ``doctor run`` into the same directory at the same time is refused in one line
  instead of mixing its records with the first's. The kernel drops the lock when the process
  ends, however it ends: a lock file left by a dead run blocks nothing;
- refuses a directory that holds an earlier run (any file or folder named as doctor names a run
  directory's: run.json, rank-*, verdict.json, node-* ...), naming ``--force``;
- with ``force``, removes the earlier run's files and folders first (links among them are
  unlinked, never followed): the new run is never merged with the old one. Files that are not
  doctor's are left where they are.

An empty or new directory is simply claimed. A node of a multi-node job claims its own folder
(``DIR/node-K``), never the directory the other nodes share.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
from pathlib import Path

from ..errors import UsageError
from . import layout

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

#: The names doctor gives the files and folders of a run directory (and of a multi-node job's).
RUN_FILES = frozenset({
    layout.RUN_RECORD, layout.CONTROL, layout.HOST, layout.GPU, layout.GPU_INFO, layout.OTHERS,
    layout.DATA_FILES, layout.MOUNTS,
    layout.BOOTSTRAP_ERRORS, layout.VERDICT, layout.REPORT, layout.TIMELINE, layout.TRIES,
    layout.NODE_RECORD, layout.NODES_RECORD, layout.STDOUT, layout.STDERR,
    ".doctor-write-check"})
_RUN_FOLDER = re.compile(r"^(rank|node)-\d+$")
_MERGE_LOCK = re.compile(r"^\.merge-[0-9a-f]+\.lock$")
#: A temporary file of doctor's: safe_files' ``.NAME.PID.N.tmp``, or an older ``NAME.tmp``.
_TEMPORARY = re.compile(r"^(?:\.(?P<new>.+)\.\d+\.\d+|(?P<old>.+))\.tmp$")

#: The locks this process holds: run directory -> the open lock file.
_held: dict[Path, int] = {}


def claim_run_dir(run_dir: Path, force: bool = False, *, option: str = "--force") -> None:
    """Make ``run_dir`` (an existing directory) this process's, for one run: lock it; refuse it
    (UsageError) when another run is recording into it, or when it holds an earlier run and
    not ``force``; with ``force``, remove the earlier run first. ``option`` is how the caller's
    user says force (``--force``, ``force=True``)."""
    key = Path(os.path.realpath(run_dir))
    if key in _held:
        return
    fd = _lock(run_dir, force)
    try:
        earlier = earlier_run(run_dir)
        if earlier and not force:
            shown = ", ".join(earlier[:3]) + (", ..." if len(earlier) > 3 else "")
            raise UsageError(f"{run_dir} holds an earlier run ({shown}): give {option} to "
                             "replace it, or a new or empty directory")
        if earlier:
            clear_run(run_dir)
    except BaseException:
        os.close(fd)
        raise
    _held[key] = fd


def share_run_dir(run_dir: Path) -> None:
    """Take ``run_dir``'s lock shared, for this process's life (``doctor try`` reading the run
    and writing its tries into it): several tries may run at once, but no ``doctor run`` may
    record into it (or replace it) meanwhile, and a try is refused while one records."""
    key = Path(os.path.realpath(run_dir))
    if key in _held:
        return
    fd = _open_lock(run_dir, force=False)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise UsageError(f"a doctor run is recording into {run_dir} now{holder}: wait for it "
                         "to end") from None
    except OSError:
        pass  # a filesystem without locks: unguarded, as a run there is
    else:
        try:  # for the message of a run refused meanwhile (tries at once: any one of them)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"try {os.getpid()}\n".encode(), 0)
        except OSError:
            pass
    _held[key] = fd


def release_run_dir(run_dir: Path) -> None:
    """Let go of ``run_dir``'s lock (the process's end does it too)."""
    fd = _held.pop(Path(os.path.realpath(run_dir)), None)
    if fd is not None:
        os.close(fd)


def _open_lock(run_dir: Path, force: bool) -> int:
    """The run directory's lock file, open (not locked), never through a link: a link planted
    there is refused, or with ``force`` replaced."""
    path = run_dir / layout.RUN_LOCK
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _CLOEXEC, 0o644)
    except OSError as err:
        if err.errno != errno.ELOOP or not force:
            what = "a symbolic link" if err.errno == errno.ELOOP else err.strerror or err
            raise UsageError(f"cannot write the run directory {run_dir}: {path.name}: "
                             f"{what}") from err
        os.unlink(path)  # a link planted where the lock goes: replaced, never followed
        return _open_lock(run_dir, force=False)


def _lock(run_dir: Path, force: bool) -> int:
    """The run directory's lock file, open and locked by this process."""
    fd = _open_lock(run_dir, force)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        doing = (f"a doctor try is re-running the run in {run_dir} now{holder[4:]}"
                 if holder.startswith(" try") else
                 f"another doctor run is recording into {run_dir} now{holder}")
        raise UsageError(f"{doing}: wait for it to end, or give another directory") from None
    except OSError:
        return fd  # a filesystem without locks: the run goes on unguarded
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        pass  # the pid only helps the message of a refused second run
    return fd


def _holder(fd: int) -> str:
    """`` (pid N)`` of the run holding the lock, `` try (pid N)`` of a try, or ``""``."""
    try:
        text = os.pread(fd, 32, 0).decode().strip()
    except (OSError, UnicodeDecodeError):
        return ""
    kind, _, pid = text.rpartition(" ")
    if not pid.isdigit() or kind not in ("", "try"):
        return ""
    return f"{' try' if kind else ''} (pid {pid})"


def is_run_entry(name: str) -> bool:
    """Whether ``name`` in a run directory is one of doctor's (a record, an output, a process
    or node folder, a merge claim, a temporary file of doctor's)."""
    if name in RUN_FILES or _RUN_FOLDER.match(name) or _MERGE_LOCK.match(name):
        return True
    temporary = _TEMPORARY.match(name)
    if temporary is None:
        return False
    base = temporary["new"] or temporary["old"] or ""
    return base in RUN_FILES or base in (layout.TRY_RECORD, layout.TIMELINE)


def earlier_run(run_dir: Path) -> list[str]:
    """The names in ``run_dir`` that belong to an earlier run (sorted); [] for an empty or new
    directory, or one holding only files that are not doctor's."""
    try:
        names = os.listdir(run_dir)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if is_run_entry(n))


def clear_run(run_dir: Path) -> None:
    """Remove the earlier run's files and folders from ``run_dir``: a link is unlinked (what it
    points to is never touched), a folder removed with what is in it."""
    for name in earlier_run(run_dir):
        path = run_dir / name
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        except FileNotFoundError:
            continue
        except OSError as err:
            raise UsageError(f"cannot remove the earlier run's {path}: "
                             f"{err.strerror or err}") from err


def clear_merged_outputs(job_dir: Path) -> None:
    """Remove a multi-node job directory's merged outputs (verdict, report, timeline and the
    record of what was merged), left by an earlier job: the last node of the new job writes
    them again. Links are unlinked, never followed."""
    merged = {layout.VERDICT, layout.REPORT, layout.TIMELINE, layout.NODES_RECORD}
    for name in earlier_run(job_dir):
        temporary = _TEMPORARY.match(name)
        base = temporary and (temporary["new"] or temporary["old"])
        if name in merged or base in merged:
            try:
                (job_dir / name).unlink()
            except OSError:
                continue  # another node removed it first, or it is a folder: not an output
