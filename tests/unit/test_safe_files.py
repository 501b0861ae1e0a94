"""doctor.store.safe_files: writes never follow a planted link; reads refuse what is not a file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from doctor.store.safe_files import (
    UnsafeFileError,
    inside,
    open_new,
    read_bounded,
    write_atomic,
    write_text_atomic,
)


def test_write_replaces_a_planted_symlink_instead_of_writing_through_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    target = tmp_path / "run" / "verdict.json"
    target.parent.mkdir()
    target.symlink_to(victim)
    write_text_atomic(target, "{}")
    assert victim.read_text() == "precious"
    assert not target.is_symlink()
    assert target.read_text() == "{}"
    assert sorted(p.name for p in target.parent.iterdir()) == ["verdict.json"]


def test_a_failed_stream_leaves_no_file_and_the_old_one_intact(tmp_path: Path) -> None:
    target = tmp_path / "timeline.json.gz"
    write_atomic(target, b"old")
    with pytest.raises(RuntimeError), open_new(target) as f:
        f.write(b"half")
        raise RuntimeError("disk gone")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["timeline.json.gz"]


def test_reads_refuse_links_fifos_devices_and_oversize(tmp_path: Path) -> None:
    good = tmp_path / "meta.json"
    good.write_bytes(b"x" * 10)
    assert read_bounded(good) == b"x" * 10
    with pytest.raises(UnsafeFileError):
        read_bounded(good, limit=9)
    link = tmp_path / "link.json"
    link.symlink_to(good)
    with pytest.raises(UnsafeFileError):
        read_bounded(link)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(UnsafeFileError):
        read_bounded(fifo)  # returns at once: opened non-blocking, then refused
    with pytest.raises(UnsafeFileError):
        read_bounded(Path("/dev/zero"))
    assert inside(good, tmp_path) and not inside(Path("/etc/passwd"), tmp_path)


def test_a_file_written_by_name_lands_whole_or_not_at_all(tmp_path: Path) -> None:
    """named_new: for writers that open a file by name (the profiler's export), the name of a
    fresh file, renamed into place on success and removed on an error; a planted link at the
    target is replaced, never followed."""
    from doctor.store.safe_files import named_new

    target = tmp_path / "trace.json"
    victim = tmp_path / "victim"
    victim.write_text("mine")
    target.symlink_to(victim)
    with named_new(target) as tmp:
        assert tmp.parent == tmp_path and tmp.is_file() and not tmp.is_symlink()
        tmp.write_text("{}")
    assert target.read_text() == "{}" and not target.is_symlink()
    assert victim.read_text() == "mine"
    try:
        with named_new(target) as tmp:
            tmp.write_text("{cut")
            raise OSError("disk full")
    except OSError:
        pass
    assert target.read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json", "victim"]
