"""The C scanner (doctor.trace.scan) gives the timeline the per-event collector gives
(tests/reference_collector.py): on every recorded trace, on awkward events cut at every place by
small chunks and blocks, on events of unusual types (decoded the slow way), and it says what is
wrong with a broken file as the slow way does."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from doctor.errors import TraceError
from doctor.trace import events as events_module
from doctor.trace import scan
from doctor.trace.collect import MAX_TIME_US
from doctor.trace.events import load_timeline
from tests.reference_collector import reference_timeline
from tests.trace_files import (
    AWKWARD,
    CLEAN,
    assert_same_timeline,
    scanned,
    write_events,
)

pytestmark = pytest.mark.skipif(not scan.AVAILABLE, reason="the C scanner is not built here "
                                "(pip install -e . builds it where a C compiler is)")


def test_the_scanner_is_built_and_says_so() -> None:
    assert scan.READER.startswith("scan (C)")
    assert events_module.SCANNER


def test_events_of_usual_types_are_all_scanned(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    slow: list[int] = []
    real = scan._Walk.slow_events
    monkeypatch.setattr(scan._Walk, "slow_events", lambda self: slow.append(1) or real(self))
    path = write_events(tmp_path / "t.json", CLEAN * 5)
    assert_same_timeline(load_timeline(path), reference_timeline(path))
    assert not slow


ODD: list[Any] = [
    {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": "14.5", "dur": "2", "tid": 1},
    {"ph": "X", "cat": "cpu_op", "name": 17, "ts": 15, "dur": 1, "tid": 1},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mul", "ts": 16, "dur": 1, "tid": 1.5},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mul", "ts": 16, "dur": 1, "tid": True},
    {"ph": "X", "cat": "kernel", "name": "k", "ts": 17, "dur": 1, "tid": 7, "args": [1, 2]},
    {"ph": "X", "cat": "kernel", "name": "k", "ts": 18, "dur": 1, "tid": 7,
     "args": {"correlation": 123456789012345678901234}},
    {"ph": ["X"], "cat": "cpu_op", "name": "aten::sub", "ts": 19, "dur": 1, "tid": 1},
    [1, 2, 3],
    "a string where an event should be",
]


@pytest.mark.parametrize("odd", range(len(ODD)))
def test_an_event_of_unusual_types_is_decoded_the_slow_way(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, odd: int) -> None:
    slow: list[int] = []
    real = scan._Walk.slow_events
    monkeypatch.setattr(scan._Walk, "slow_events", lambda self: slow.append(1) or real(self))
    events = [*CLEAN, ODD[odd], *CLEAN]
    path = write_events(tmp_path / "t.json", events)
    scanned(path)
    assert slow
    assert_same_timeline(load_timeline(path), reference_timeline(path))


def test_names_written_with_escapes_are_the_same_names(tmp_path: Path) -> None:
    raw = ('{"traceEvents": ['
           '{"ph": "X", "cat": "cpu_op", "name": "caf\\u00e9 \\"op\\"", "ts": 1, "dur": 1, '
           '"tid": 1},'
           '{"ph": "X", "cat": "cpu_op", "name": "café \\"op\\"", "ts": 2, "dur": 1, '
           '"tid": 1},'
           '{"ph": "X", "cat": "cpu\\u005fop", "name": "x", "ts": 3, "dur": 1, "tid": "1"}]}')
    path = tmp_path / "t.json"
    path.write_text(raw, encoding="utf-8")
    got = load_timeline(path)
    assert [got.names[c] for c in got.host_ops.attrs["name"]] == ['café "op"'] * 2 + ["x"]
    assert got.tids == ["1"]  # the thread 1 and "1" are one thread, as str() writes it
    assert_same_timeline(got, reference_timeline(path))


def test_numbers_are_the_numbers_python_reads(tmp_path: Path) -> None:
    rng = random.Random(7)
    texts = ["0", "-0", "1", "-1.5", "1e3", "2.5E-3", "123456789012345678901234567890",
             "0.1", "1700000000000.123", "9007199254740993", "1.5e300",
             "0.000000000000000000000000001", "5e-324"]
    texts += [f"{rng.randrange(10**rng.randrange(1, 20))}.{rng.randrange(10**6):06d}"
              for _ in range(300)]
    raw = "[" + ",".join(f'{{"ph": "X", "cat": "cpu_op", "name": "n{k}", "ts": {t}, '
                         f'"dur": {t}, "tid": 1}}' for k, t in enumerate(texts)) + "]"
    path = tmp_path / "t.json"
    path.write_text(raw)
    got = load_timeline(path)  # (its origin is 0: the starts are the numbers themselves)
    # times past any clock (MAX_TIME_US) are left out as damage, as negative durations are
    want = sorted(float(t) for t in texts if 0 <= float(t) < MAX_TIME_US)
    np.testing.assert_array_equal(np.sort(got.host_ops.start + got.origin_us), want)


@pytest.mark.parametrize("cut", [0.3, 0.6, 0.99])
def test_a_truncated_trace_is_one_line(tmp_path: Path, cut: float) -> None:
    text = json.dumps({"traceEvents": AWKWARD * 40})
    path = tmp_path / "cut.json"
    path.write_text(text[: int(len(text) * cut)])
    with pytest.raises(TraceError) as err:
        load_timeline(path)
    assert "\n" not in str(err.value) and "cut.json" in str(err.value)
    with pytest.raises(scan.NotScanned):
        scanned(path)


@pytest.mark.parametrize("text", ['{"traceEvents": [{"ph": "X",, "ts": 1}]}',
                                  '{"traceEvents": [{"ph": "X" "ts": 1}]}',
                                  '{"traceEvents": [{"ts": 1x}]}', "not json", ""])
def test_text_that_is_not_json_is_one_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(TraceError) as err:
        load_timeline(path)
    assert "\n" not in str(err.value) and "bad.json" in str(err.value)


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such trace file"):
        load_timeline(tmp_path / "nothing.json")


def test_metadata_before_and_after_the_events(tmp_path: Path) -> None:
    raw = ('{"distributedInfo": {"rank": 3, "world_size": 8, "backend": "nccl"}, '
           '"deviceProperties": [{"name": "A100"}], "traceEvents": '
           + json.dumps(CLEAN) + ', "baseTimeNanoseconds": 1700000000000000000, '
           '"traceName": "x"}')
    path = tmp_path / "t.json"
    path.write_text(raw)
    got = load_timeline(path)
    assert (got.meta.rank, got.meta.world_size, got.meta.backend) == (3, 8, "nccl")
    assert got.meta.base_time_ns == 1700000000000000000
    assert_same_timeline(got, reference_timeline(path))


def test_args_that_are_not_utf8_are_read_as_the_slow_way_reads_them(tmp_path: Path) -> None:
    raw = (b'[{"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", '
           b'"ts": 1, "dur": 2, "tid": 7, "args": {"note": "\xff\xfe", "bytes": 4096, '
           b'"correlation": 5}}, {"ph": "X", "cat": "kernel", "name": "k\xff", "ts": 3, '
           b'"dur": 1, "tid": 7, "args": {"correlation": 6}}]')
    path = tmp_path / "t.json"
    path.write_bytes(raw)
    got = load_timeline(path)
    assert got.memcpy.attrs["bytes"].tolist() == [4096]
    assert got.kernels.attrs["corr"].tolist() == [6]
    assert_same_timeline(got, reference_timeline(path))


def test_args_read_in_bulk_are_the_args_the_slow_way_reads(tmp_path: Path) -> None:
    """The memory instants' totals and the collectives' arguments are read from the args'
    bytes for many events at once: numbers given as strings, true, repeated keys and calls
    written two ways give what the slow way gives."""
    mem = {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "tid": 1}
    coll = {"ph": "X", "cat": "cpu_op", "name": "nccl:all_reduce", "dur": 2, "tid": 5}
    events: list[dict[str, Any]] = [
        {**mem, "ts": 1, "args": {"Device Type": 1, "Device Id": 0, "Total Allocated": 2**40,
                                  "Total Reserved": 2**41}},
        {**mem, "ts": 2, "args": {"Device Type": 1, "Device Id": 0, "Total Allocated": "1024",
                                  "Total Reserved": 4096.0}},
        {**mem, "ts": 3, "args": {"Device Type": True, "Device Id": 0, "Total Allocated": 1,
                                  "Total Reserved": 1}},
        {**mem, "ts": 4, "args": {"Device Type": 1, "Total Allocated": 1, "Total Reserved": 1}},
        {**mem, "ts": 5},
        {**coll, "ts": 10, "args": {"Collective name": "allreduce", "In msg nelems": 10,
                                    "dtype": "Float", "Group size": 2, "External id": 1}},
        {**coll, "ts": 11, "args": {"Collective name": "allreduce", "In msg nelems": 10,
                                    "dtype": "Float", "Group size": 2, "External id": 2}},
        {**coll, "ts": 12, "args": {"Collective name": "allgather", "Out msg nelems": 1e1,
                                    "dtype": "Half", "Group size": 4}},
        {**coll, "ts": 13, "args": {"Input Dims": [[4, 4]], "Input type": ["float"]}},
        {**coll, "ts": 14},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
         "ts": 15, "dur": 5, "tid": 7, "args": {"correlation": 40, "In msg nelems": "10",
                                               "dtype": "Float", "Group size": 2}},
    ]
    path = write_events(tmp_path / "t.json", events * 3)
    got = load_timeline(path)
    assert_same_timeline(got, reference_timeline(path))
    assert len(got.memory) == 6  # the ones with all four totals as numbers (strings too)
    assert got.comm_ops.attrs["bytes"].tolist()[:3] == [40, 40, 40]
