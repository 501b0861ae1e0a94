"""doctor run writes the bytecode of its in-job modules before the job starts, so each process
of a job under PYTHONDONTWRITEBYTECODE=1 does not compile them again (doctor.record.bytecode)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from doctor import probes
from doctor.record.bytecode import compile_missing, in_job_sources, is_current


def _module(folder: Path, name: str = "m", text: str = "X = 1\n") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / f"{name}.py"
    source.write_text(text)
    return source


def test_missing_bytecode_is_written_once_and_again_when_the_source_changes(tmp_path: Path
                                                                            ) -> None:
    source = _module(tmp_path)
    cached = Path(importlib.util.cache_from_source(str(source)))
    assert compile_missing([source]) == 1
    assert cached.is_file() and is_current(cached, source.stat())
    assert compile_missing([source]) == 0
    source.write_text("X = 22\n")
    os.utime(source, (source.stat().st_atime, source.stat().st_mtime + 5))
    assert not is_current(cached, source.stat())
    assert compile_missing([source]) == 1 and is_current(cached, source.stat())


def test_the_written_bytecode_is_what_an_import_uses(tmp_path: Path) -> None:
    """An import under PYTHONDONTWRITEBYTECODE=1 runs the bytecode written for it rather than
    compiling the source: the source is then changed to the same size and mtime, and the import
    still sees the old value."""
    source = _module(tmp_path, "probe_me", "X = 1\n")
    compile_missing([source])
    stat = source.stat()
    source.write_text("X = 2\n")
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", "import probe_me; print(probe_me.X)"], env=env,
                         capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.strip() == "1"


def test_an_unwritable_folder_or_a_broken_source_is_skipped_without_a_word(tmp_path: Path
                                                                           ) -> None:
    broken = _module(tmp_path / "a", "broken", "def (:\n")
    fine = _module(tmp_path / "b", "fine")
    locked = _module(tmp_path / "c", "locked")
    os.chmod(tmp_path / "c", 0o555)
    try:
        written = compile_missing([broken, fine, locked])
    finally:
        os.chmod(tmp_path / "c", 0o755)
    assert written == 1 + (os.geteuid() == 0)  # root writes through a read-only mode bit
    assert not Path(importlib.util.cache_from_source(str(broken))).exists()


def test_damaged_bytecode_is_not_current(tmp_path: Path) -> None:
    source = _module(tmp_path)
    cached = Path(importlib.util.cache_from_source(str(source)))
    cached.parent.mkdir()
    for junk in (b"", b"\x00" * 16, importlib.util.MAGIC_NUMBER + b"\x01" + b"\x00" * 11):
        cached.write_bytes(junk)
        assert not is_current(cached, source.stat())
    assert compile_missing([source]) == 1


def test_the_in_job_sources_cover_the_bootstrap_the_recorder_and_the_probes() -> None:
    names = {p.relative_to(p.parents[1]).as_posix()
             for p in in_job_sources(Path(probes.__file__).resolve().parent)}
    for expected in ("_bootstrap/sitecustomize.py", "record/session.py", "store/ringbuffer.py",
                     "probes/steps.py", "doctor/errors.py"):
        assert expected in names, expected
