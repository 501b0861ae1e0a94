"""doctor run writes the bytecode of its in-job modules before the job starts, so each process
of a job under PYTHONDONTWRITEBYTECODE=1 does not compile them again (doctor.record.bytecode).

The tests here start jobs, processes or real clocks (tests/e2e); the pure ones are in
tests/unit/test_bytecode.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from doctor.record.bytecode import compile_missing
from tests.support import write_module


def test_the_written_bytecode_is_what_an_import_uses(tmp_path: Path) -> None:
    """An import under PYTHONDONTWRITEBYTECODE=1 runs the bytecode written for it rather than
    compiling the source: the source is then changed to the same size and mtime, and the import
    still sees the old value."""
    source = write_module(tmp_path, "probe_me", "X = 1\n")
    compile_missing([source])
    stat = source.stat()
    source.write_text("X = 2\n")
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", "import probe_me; print(probe_me.X)"], env=env,
                         capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.strip() == "1"
