"""The streaming trace reader: layouts, chunk boundaries, big numbers, broken files, memory."""

from __future__ import annotations

import gzip
import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from doctor.errors import DoctorError
from doctor.trace.reader import TraceError, TraceMeta, TraceStream, iter_events
from tests.trace_files import write_trace

EVENTS: list[dict[str, Any]] = [
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 5},
    {"ph": "X", "cat": "kernel", "name": "sgemm", "pid": 0, "tid": 7, "ts": 12.5, "dur": 3.25,
     "args": {"stream": 7, "note": "brace } and bracket ] in a string, comma, too"}},
    {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "python"}},
]


def read_metadata(path: Path) -> TraceMeta:
    """The trace's top-level facts, known once it is read through."""
    stream = TraceStream(path)
    for _ in stream:
        pass
    return stream.meta


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("chunk", [3, 17, 1 << 20])
def test_object_layout_with_metadata_around_the_events(
    tmp_path: Path, gz: bool, chunk: int
) -> None:
    payload = {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "nccl", "rank": 3, "world_size": 8},
        "traceEvents": EVENTS,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": 1711964646000000000,  # after the events, as recent Kineto writes
    }
    path = write_trace(tmp_path / ("t.json.gz" if gz else "t.json"), payload, gz)
    stream = TraceStream(path, chunk_chars=chunk)
    assert list(stream) == EVENTS
    meta = stream.meta
    assert (meta.rank, meta.world_size, meta.backend) == (3, 8, "nccl")
    assert meta.base_time_ns == 1711964646000000000
    assert meta.schema_version == 1


@pytest.mark.parametrize("chunk", [2, 5, 1 << 20])
def test_bare_list_layout(tmp_path: Path, chunk: int) -> None:
    path = write_trace(tmp_path / "old.pt.trace.json", EVENTS)
    assert list(iter_events(path, chunk_chars=chunk)) == EVENTS
    assert read_metadata(path).rank is None


def test_whitespace_trailing_commas_and_non_dict_elements(tmp_path: Path) -> None:
    raw = '\n { "traceEvents" : [\n {"ph": "X", "ts": 1, "dur": 2} ,\n 7, {"ph": "i"},\n ] ,\n }\n'
    assert list(iter_events(write_trace(tmp_path / "t.json", None, raw=raw))) == [
        {"ph": "X", "ts": 1, "dur": 2}, {"ph": "i"},
    ]


def test_huge_integers_decode(tmp_path: Path) -> None:
    big = 10159970886766084423123456789
    payload = {"traceEvents": [{"ph": "X", "ts": 1, "dur": 2, "args": {"Comms Id": big}}]}
    for chunk in (4, 1 << 20):
        path = write_trace(tmp_path / "t.json.gz", payload, gz=True)
        (ev,) = iter_events(path, chunk_chars=chunk)
        assert ev["args"]["Comms Id"] == big


def test_number_cut_by_a_chunk_boundary_is_read_whole(tmp_path: Path) -> None:
    raw = '{"baseTimeNanoseconds": 123456789012345678, "traceEvents": []}'
    for chunk in range(1, 12):
        stream = TraceStream(write_trace(tmp_path / "t.json", None, raw=raw), chunk_chars=chunk)
        assert list(stream) == []
        assert stream.meta.base_time_ns == 123456789012345678


@pytest.mark.parametrize("gz", [False, True])
def test_truncated_file_raises_one_line_trace_error(tmp_path: Path, gz: bool) -> None:
    text = json.dumps({"schemaVersion": 1, "traceEvents": EVENTS * 50})
    path = write_trace(tmp_path / "cut.json", None, gz=gz, raw=text[: len(text) // 2])
    with pytest.raises(TraceError) as err:
        list(iter_events(path, chunk_chars=64))
    message = str(err.value)
    assert "\n" not in message
    assert "truncated" in message
    assert "cut.json" in message
    assert isinstance(err.value, DoctorError)  # the CLI's one error hierarchy


def test_truncated_gzip_stream_raises_trace_error(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t.json.gz", {"traceEvents": EVENTS * 500}, gz=True)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError):
        list(iter_events(path))


@pytest.mark.parametrize("raw", ["", "   ", "hello", '{"traceEvents": [{"ph": "X",, }]}',
                                 '{"traceEvents": 5}', '{"a" 1}'])
def test_not_a_trace_raises_trace_error(tmp_path: Path, raw: str) -> None:
    with pytest.raises(TraceError):
        list(iter_events(write_trace(tmp_path / "bad.json", None, raw=raw)))


def test_missing_file_raises_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such trace file"):
        list(iter_events(tmp_path / "absent.json"))


def test_metadata_defaults_when_absent_or_odd(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t.json", {"distributedInfo": {"rank": "2"}, "traceEvents": []})
    meta = read_metadata(path)
    assert (meta.rank, meta.world_size, meta.backend, meta.device_properties) == (2, None, None, ())
    path = write_trace(tmp_path / "u.json", {"distributedInfo": [], "deviceProperties": "x",
                                       "traceEvents": []})
    meta = read_metadata(path)
    assert (meta.rank, meta.device_properties) == (None, ())


def test_memory_stays_bounded_below_the_decoded_size(tmp_path: Path) -> None:
    event = {"ph": "X", "cat": "kernel", "name": "void at::native::kernel<float>()" * 3,
             "pid": 0, "tid": 7, "ts": 1.5, "dur": 2.0, "args": {"stream": 7, "grid": [1, 2, 3]}}
    path = tmp_path / "big.json.gz"
    n = 80_000  # 17 MB of JSON: ISA-L's gunzip reads its compressed input 512 KB at a time
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write('{"schemaVersion": 1, "traceEvents": [')
        fh.write(",".join([json.dumps(event)] * n))
        fh.write("]}")
    decoded = n * len(json.dumps(event))
    tracemalloc.start()
    try:
        count = sum(1 for _ in iter_events(path, chunk_chars=1 << 18))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == n
    assert decoded > 16_000_000
    assert peak < decoded / 5, f"peak {peak} bytes for {decoded} bytes of JSON"
