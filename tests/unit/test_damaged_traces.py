"""Traces that are damaged, or written by a tool with other ideas of the fields' types: the
trace door reads them or says in one line what is wrong (never a traceback), and the C scanner
and the slow way agree on what they read. Seeded mutations of a small trace, so the cases are the
same on every run.

The quick tests (tests/unit); the sweeps over hundreds of seeded damages are in
tests/sweeps/test_damaged_traces.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from doctor.trace.events import Timeline
from tests.trace_files import HUGE, assert_same_timeline, read_both_ways

COLL = ('{"ph": "X", "cat": "cpu_op", "name": "nccl:all_reduce", "ts": 1, "dur": 2, "tid": 5, '
        '"args": %s}')
MM = '{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 3, "dur": 2, "tid": 5, "args": %s}'


@pytest.mark.parametrize("raw", [
    "[" + COLL % '{"Collective name": "allreduce", "In msg nelems": 1-2, "dtype": "Float"}' + "]",
    "[" + MM % '{"Input Dims": [[2, 2], [2, 2]], "Input type": [tru, "float"]}' + "]",
    '[{"ph": "X", "cat": "kernel", "name": "k\\q", "ts": 1, "dur": 1, "tid": 7}]',
], ids=["a number", "a literal", "an escape"])
def test_args_and_names_that_are_not_json_are_one_line(tmp_path: Path, raw: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The scanner checks an event's structure and skips over its args; where a value it
    skipped is not JSON, the trace is read again the slow way, which says where."""
    path = tmp_path / "bad.json"
    path.write_bytes(raw.encode() + b"\xff" * ("escape" in raw))
    for got in read_both_ways(path, monkeypatch):
        assert isinstance(got, str) and "invalid JSON" in got and "truncated" not in got


def test_args_of_odd_types_and_sizes_are_read(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A collective's name that is a number, counts past int64: read, with no size."""
    raw = "[" + ", ".join([
        COLL % '{"Collective name": 1.5, "In msg nelems": 10, "dtype": "Float"}',
        COLL % json.dumps({"Collective name": "allreduce", "In msg nelems": 10**400,
                           "dtype": "Float", "Group size": HUGE}),
        MM % json.dumps({"Input Dims": [[HUGE, 4], [4, 4]], "Input type": ["float", "float"]}),
        '{"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "ts": 5, '
        '"dur": 2, "tid": 7, "args": {"bytes": "inf", "correlation": 5}}',
    ]) + "]"
    path = tmp_path / "odd.json"
    path.write_text(raw)
    timelines = read_both_ways(path, monkeypatch)
    for got in timelines:
        assert isinstance(got, Timeline)
        assert got.comm_ops.attrs["bytes"].tolist() == [40, -1]
        assert got.comm_ops.attrs["group"].tolist() == [-1, -1]
        assert got.memcpy.attrs["bytes"].tolist() == [-1]
    if len(timelines) == 2:  # the scanner's and the slow way's
        assert_same_timeline(*timelines)  # type: ignore[arg-type]




@pytest.mark.parametrize("field", ["ts", "dur"])
@pytest.mark.parametrize("value", ["18446744073709551617", "9223372036854775808", "1e300"])
def test_times_past_any_clock_are_left_out(tmp_path: Path, field: str, value: str) -> None:
    """A step whose start or duration no clock reaches (a damaged or hostile trace) is left
    out, never a share above 1 or a median step of centuries."""
    from doctor.pipeline import analyze_traces

    step = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1,
            "ts": 1, "dur": 100}
    step[field] = "@"
    raw = json.dumps({"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 5},
        step]}).replace('"@"', value)
    path = tmp_path / "far.json"
    path.write_text(raw)
    verdict = analyze_traces([path]).verdict
    assert all(0.0 <= s <= 1.0 for s in verdict.shares.values())
    assert sum(verdict.shares.values()) == pytest.approx(1.0)
    assert verdict.steps["median_s"] < 1.0
