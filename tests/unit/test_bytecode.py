"""doctor run writes the bytecode of its in-job modules before the job starts, so each process
of a job under PYTHONDONTWRITEBYTECODE=1 does not compile them again (doctor.record.bytecode)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from doctor import probes
from doctor.record.bytecode import compile_missing, in_job_sources, is_current
from tests.support import write_module


def test_missing_bytecode_is_written_once_and_again_when_the_source_changes(tmp_path: Path
                                                                            ) -> None:
    source = write_module(tmp_path)
    cached = Path(importlib.util.cache_from_source(str(source)))
    assert compile_missing([source]) == 1
    assert cached.is_file() and is_current(cached, source.stat())
    assert compile_missing([source]) == 0
    source.write_text("X = 22\n")
    os.utime(source, (source.stat().st_atime, source.stat().st_mtime + 5))
    assert not is_current(cached, source.stat())
    assert compile_missing([source]) == 1 and is_current(cached, source.stat())


def test_an_unwritable_folder_or_a_broken_source_is_skipped_without_a_word(tmp_path: Path
                                                                           ) -> None:
    broken = write_module(tmp_path / "a", "broken", "def (:\n")
    fine = write_module(tmp_path / "b", "fine")
    locked = write_module(tmp_path / "c", "locked")
    os.chmod(tmp_path / "c", 0o555)
    try:
        written = compile_missing([broken, fine, locked])
    finally:
        os.chmod(tmp_path / "c", 0o755)
    assert written == 1 + (os.geteuid() == 0)  # root writes through a read-only mode bit
    assert not Path(importlib.util.cache_from_source(str(broken))).exists()


def test_damaged_bytecode_is_not_current(tmp_path: Path) -> None:
    source = write_module(tmp_path)
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
