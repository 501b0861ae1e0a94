from __future__ import annotations

from pathlib import Path

import pytest

from doctor.store.ringbuffer import RingFormatError, RingWriter, read_ring


def test_records_come_back_in_order(tmp_path: Path) -> None:
    ring = RingWriter(tmp_path / "a.ring", "<qqi", ("t0_ns", "t1_ns", "key"), capacity=8)
    for i in range(5):
        ring.write(i, i + 10, i % 2)
    rec, written = read_ring(tmp_path / "a.ring")
    assert written == 5
    assert list(rec["t0_ns"]) == [0, 1, 2, 3, 4]
    assert list(rec["key"]) == [0, 1, 0, 1, 0]


def test_wraps_around_keeping_the_newest(tmp_path: Path) -> None:
    ring = RingWriter(tmp_path / "a.ring", "<qi", ("t_ns", "kind"), capacity=4)
    for i in range(11):
        ring.write(i, 0)
    rec, written = read_ring(tmp_path / "a.ring")
    assert written == 11
    assert list(rec["t_ns"]) == [7, 8, 9, 10]


def test_file_size_is_fixed_whatever_is_written(tmp_path: Path) -> None:
    ring = RingWriter(tmp_path / "a.ring", "<qi", ("t_ns", "kind"), capacity=16)
    size = (tmp_path / "a.ring").stat().st_size
    for i in range(1000):
        ring.write(i, 1)
    ring.close()
    assert (tmp_path / "a.ring").stat().st_size == size


def test_records_survive_without_close(tmp_path: Path) -> None:
    ring = RingWriter(tmp_path / "a.ring", "<qi", ("t_ns", "kind"), capacity=16)
    ring.write(42, 3)
    rec, _ = read_ring(tmp_path / "a.ring")  # another reader, writer still open
    assert rec["t_ns"][0] == 42


def test_rejects_foreign_files(tmp_path: Path) -> None:
    (tmp_path / "x.ring").write_bytes(b"not a ring" * 40)
    with pytest.raises(RingFormatError):
        read_ring(tmp_path / "x.ring")


def test_names_must_match_format(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        RingWriter(tmp_path / "a.ring", "<qi", ("only_one",), capacity=4)


@pytest.mark.parametrize("count", [0, 1, 2, 7, 8, 9, 15, 16, 17, 40])
def test_any_fill_reads_back_whole_and_in_order(tmp_path: Path, count: int) -> None:
    ring = RingWriter(tmp_path / "a.ring", "<qi", ("t_ns", "kind"), capacity=16)
    for i in range(count):
        ring.write(i, 0)
    rec, written = read_ring(tmp_path / "a.ring")
    assert written == count
    assert list(rec["t_ns"]) == list(range(max(0, count - 16), count))
