"""Compiled bytecode for the modules doctor runs inside the job, written before the job starts.

Every Python process of a job (its DataLoader workers, the helpers it starts) loads doctor's
in-job modules through the bootstrap. Python reads their ``__pycache__/*.pyc`` when it is there
and current, and otherwise compiles the source in that process: ~18 ms for the private package's
modules on this 2-core machine, in every process, when the job's environment says
``PYTHONDONTWRITEBYTECODE=1`` (common in containers), since then no process ever writes the
bytecode it compiled. So ``doctor run`` compiles those modules itself, once, into doctor's own
folders (where ``pip install`` puts them too), before it starts the job. The job's own files are
never touched. A folder doctor cannot write (a read-only install) is left as it is: the job then
compiles as it would have.

Runs in the ``doctor run`` process, never in the job.
"""

from __future__ import annotations

import importlib.util
import os
import py_compile
from collections.abc import Iterable
from pathlib import Path

DOCTOR_DIR = Path(__file__).resolve().parents[1]
#: The folders whose modules the job may load (the bootstrap, the recorder, the run directory's
#: writers, the probes) and the shared kernel at doctor's top (errors, tuning, ...). Compiling a
#: few more than the job loads costs the first ``doctor run`` a fraction of a second, once.
IN_JOB_FOLDERS = ("record", "record/_bootstrap", "store")


def in_job_sources(probes_dir: Path) -> list[Path]:
    """The source files of what the job may load: doctor's top-level modules, its in-job
    folders and the probes (``probes_dir``: beside doctor/ in a checkout, inside it installed)."""
    folders = [DOCTOR_DIR, *(DOCTOR_DIR / f for f in IN_JOB_FOLDERS), probes_dir]
    return sorted({p for folder in folders for p in folder.glob("*.py")})


def compile_missing(sources: Iterable[Path]) -> int:
    """Write the bytecode of each source whose cached bytecode is missing or older than it;
    return how many were written. Never raises: a file that cannot be compiled or written is
    skipped (the process that imports it compiles it then, as without doctor)."""
    written = 0
    for source in sources:
        try:
            cached = Path(importlib.util.cache_from_source(str(source)))
            if is_current(cached, source.stat()):
                continue
            if not os.access(source.parent, os.W_OK):
                continue
            # TIMESTAMP: the check an import makes by default (SOURCE_DATE_EPOCH would switch
            # py_compile to hashed bytecode, which each import then re-hashes)
            py_compile.compile(str(source), cfile=str(cached), doraise=True,
                               invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
            written += 1
        except (OSError, SyntaxError, ValueError, py_compile.PyCompileError):
            continue
    return written


def is_current(cached: Path, source: os.stat_result) -> bool:
    """Whether ``cached`` is bytecode an import would use for a source of this size and mtime:
    this Python's magic number, timestamp-checked, the source's mtime and size (PEP 552)."""
    try:
        with open(cached, "rb") as f:
            header = f.read(16)
    except OSError:
        return False
    if len(header) < 16 or header[:4] != importlib.util.MAGIC_NUMBER:
        return False
    flags, mtime, size = (int.from_bytes(header[i:i + 4], "little") for i in (4, 8, 12))
    return (flags == 0 and mtime == int(source.st_mtime) & 0xFFFFFFFF
            and size == source.st_size & 0xFFFFFFFF)
