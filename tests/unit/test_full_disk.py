"""A full or failing disk never reaches the job: rings reserve their blocks as they grow and stop
(said once) when they cannot; doctor's other writes in the job stop the same way; ``doctor run``
with no room at the start runs the job without doctor; at the end, one line, never a traceback.

Real full filesystems are a 4 MB tmpfs (skipped, with the reason, where mount is refused) and a
file-size limit (RLIMIT_FSIZE) set by the job itself, which needs no privilege."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from doctor.record.session import Session
from doctor.store import layout
from doctor.store.process import ProcessWriter
from doctor.store.ringbuffer import (
    HEADER_SIZE,
    PAGE,
    RingWriter,
    read_ring,
    ring_stop_reason,
)

RECORD = ("<qqi", ("t0_ns", "t1_ns", "key"))  # 28 bytes with the sequence number


def _fallocate_fails_after(monkeypatch: pytest.MonkeyPatch, calls: int,
                           code: int = errno.ENOSPC) -> list[int]:
    """os.posix_fallocate succeeds ``calls`` times, then fails with ``code``."""
    real = os.posix_fallocate
    seen: list[int] = []

    def fallocate(fd: int, offset: int, length: int) -> None:
        seen.append(length)
        if len(seen) > calls:
            raise OSError(code, os.strerror(code))
        real(fd, offset, length)

    monkeypatch.setattr(os, "posix_fallocate", fallocate)
    return seen


# ----- the ring writer ---------------------------------------------------------------------

def test_a_ring_is_as_large_as_what_it_holds_on_disk_and_in_apparent_size(
        tmp_path: Path) -> None:
    path = tmp_path / "a.ring"
    ring = RingWriter(path, *RECORD, capacity=1 << 17)
    for i in range(10):
        ring.write(i, i, 0)
    assert path.stat().st_size == PAGE  # not 3.5 MB of sparse file
    assert path.stat().st_blocks * 512 <= 2 * PAGE
    for i in range(1000):
        ring.write(i, i, 0)
    assert PAGE < path.stat().st_size <= 2 * (HEADER_SIZE + 1010 * 28) + PAGE
    for i in range((1 << 17) + 5):
        ring.write(i, i, 0)
    assert path.stat().st_size == HEADER_SIZE + (1 << 17) * 28  # bounded by the capacity
    ring.close()
    records, written = read_ring(path)
    assert written == 1010 + (1 << 17) + 5 and len(records) == 1 << 17


def test_every_page_written_is_reserved_before_it(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Each write lands inside what posix_fallocate reserved (no page fault can need a block)."""
    reserved = _fallocate_fails_after(monkeypatch, 10**9)
    path = tmp_path / "a.ring"
    ring = RingWriter(path, *RECORD, capacity=5000)
    for i in range(4321):
        ring.write(i, i, 1)
        end = HEADER_SIZE + (i + 1) * 28
        assert end <= sum(reserved) == path.stat().st_size
    assert len(reserved) < 12  # a reservation per chunk, not per record


def test_a_ring_that_cannot_grow_stops_and_says_so_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fallocate_fails_after(monkeypatch, 2)
    stops: list[OSError] = []
    path = tmp_path / "a.ring"
    ring = RingWriter(path, *RECORD, capacity=1 << 17, on_stop=stops.append)
    for i in range(5000):
        ring.write(i, i + 1, 2)  # never raises
    assert len(stops) == 1 and stops[0].errno == errno.ENOSPC
    assert ring.stopped is stops[0]
    records, written = read_ring(path)
    kept = (path.stat().st_size - HEADER_SIZE) // 28
    assert written == kept == len(records) and 0 < kept < 5000
    assert list(records["t0_ns"]) == list(range(kept))
    assert ring_stop_reason(path) == "no space left on device"
    ring.close()
    ring.write(1, 2, 3)  # after close too: dropped, never an error


def test_a_ring_that_cannot_be_created_records_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fallocate_fails_after(monkeypatch, 0, errno.EIO)
    stops: list[OSError] = []
    ring = RingWriter(tmp_path / "a.ring", *RECORD, capacity=64, on_stop=stops.append)
    ring.write(1, 2, 3)
    assert [e.errno for e in stops] == [errno.EIO] and ring.written == 0
    assert not (tmp_path / "a.ring").exists()  # no headerless file left to misread


@pytest.mark.parametrize("cut", [0, 1, 27, 28, 29, 5 * 28 + 3])
def test_a_short_ring_reads_back_what_it_holds(tmp_path: Path, cut: int) -> None:
    path = tmp_path / "a.ring"
    ring = RingWriter(path, *RECORD, capacity=1 << 10)
    for i in range(20):
        ring.write(i, i, 0)
    ring.close()
    os.truncate(path, HEADER_SIZE + cut)
    records, written = read_ring(path)
    assert list(records["t0_ns"]) == list(range(cut // 28))
    assert written == cut // 28
    assert ring_stop_reason(path) is None


def test_a_ring_replaces_a_planted_link_and_never_writes_through_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    path = tmp_path / "a.ring"
    path.symlink_to(victim)
    ring = RingWriter(path, *RECORD, capacity=16)
    ring.write(1, 2, 3)
    ring.close()
    assert victim.read_text() == "mine"
    assert not path.is_symlink() and read_ring(path)[1] == 1


# ----- the Session: every write of doctor's in the job ------------------------------------------

def test_the_session_records_what_stopped_and_never_raises(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    session = Session(tmp_path / "run", rank=0)
    session.probe_status = {"steps": {"ok": True}}
    _fallocate_fails_after(monkeypatch, 1)  # the first page, then no more room
    for i in range(500):
        session.record_interval("optimizer", i, i + 1)
    status = session.probe_status["steps"]
    assert not status["ok"] and status["reason"] == \
        "stopped: no space left on device (optimizer.ring)"
    session.close()
    meta = json.loads((session.directory / layout.META).read_text())
    assert meta["probes"]["steps"]["reason"].startswith("stopped: no space left on device")
    assert meta["rings"]["optimizer"] == (PAGE - HEADER_SIZE) // 28  # what the ring kept


def test_a_process_folder_that_cannot_be_made_records_nothing_quietly(tmp_path: Path) -> None:
    blocker = tmp_path / "run"
    blocker.write_text("a file where the run directory should be")
    session = Session(blocker, rank=0)
    session.mark_step(2)
    session.record_interval("loader_wait", 1, 2)
    session.record_event(1, 0)
    session.update_meta(loaders=[{"id": 0}])
    session.record_memory({"t_ns": 1})
    session.close()
    assert not session.recording
    assert session.probe_status["steps"]["reason"].startswith("stopped: not a directory")


def test_memory_snapshots_stop_whole_lines_when_a_write_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    session = Session(tmp_path / "run", rank=0)
    session.record_memory({"t_ns": 1, "tag": "step"})
    real_write = os.write

    def full(fd: int, data: bytes) -> int:
        return real_write(fd, data[:5])  # a short write: the disk filled

    monkeypatch.setattr(os, "write", full)
    session.record_memory({"t_ns": 2, "tag": "step"})
    session.record_memory({"t_ns": 3, "tag": "step"})
    monkeypatch.setattr(os, "write", real_write)
    lines = (session.directory / layout.MEMORY).read_text().splitlines()
    assert [json.loads(line)["t_ns"] for line in lines] == [1]
    assert session.probe_status["memory"]["reason"] == \
        "stopped: no space left on device (memory.jsonl)"
    session.close()


def test_a_trace_export_cut_short_is_removed(tmp_path: Path) -> None:
    writer = ProcessWriter(tmp_path / "run", 0, "main", 1)
    writer.create()

    def export(path: str) -> None:  # Kineto on a full disk: a part written, and no error
        Path(path).write_text('{"traceEvents": [{"name": "aten::mm"')

    with pytest.raises(OSError):
        writer.export_trace(export)
    assert os.listdir(writer.path) == []
    writer.export_trace(lambda path: Path(path).write_text('{"traceEvents": []}\n'))
    assert os.listdir(writer.path) == [layout.TRACE]


# ----- doctor run on a filesystem that fills ----------------------------------------------------


def test_a_filesystem_without_fallocate_gets_its_blocks_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def unsupported(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    path = tmp_path / "a.ring"
    ring = RingWriter(path, *RECORD, capacity=1000)
    for i in range(600):
        ring.write(i, i, 0)
    assert ring.stopped is None and read_ring(path)[1] == 600
    assert path.stat().st_blocks * 512 >= path.stat().st_size  # written, not sparse
