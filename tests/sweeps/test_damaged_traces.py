"""Traces that are damaged, or written by a tool with other ideas of the fields' types: the
trace door reads them or says in one line what is wrong (never a traceback), and the C scanner
and the slow way agree on what they read. Seeded mutations of a small trace, so the cases are the
same on every run.

The sweeps here (tests/sweeps: every recorded trace, every place a trace can be cut, hundreds
of seeded damages) take tens of seconds; the quick tests are in tests/unit/test_damaged_traces.py.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from doctor.errors import TraceError
from doctor.pipeline import analyze_traces
from doctor.reports.json import render_json
from doctor.reports.text import render_text
from doctor.trace.events import Timeline
from tests.trace_files import AWKWARD, HUGE, assert_same_timeline, read_both_ways

#: Damaged copies read (one in a hundred or so broke the reader before it checked the values
#: it skips over).
CASES = 600


def mutated(rng: random.Random, text: bytes) -> bytes:
    """``text`` with a few bytes replaced, deleted, inserted or copied from elsewhere."""
    alphabet = b'{}[]",:\\0123456789.eE+-tfnul "aXxBM\x00\xff\xc3'
    b = bytearray(text)
    for _ in range(rng.randint(1, 6)):
        op, at = rng.random(), rng.randrange(len(b))
        if op < 0.4:
            b[at] = rng.choice(alphabet)
        elif op < 0.6:
            del b[at:at + rng.randint(1, 20)]
        elif op < 0.8:
            b[at:at] = bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 8)))
        else:
            b[at:at] = b[rng.randrange(len(b)):][:rng.randint(1, 200)]
    return bytes(b)


def test_damaged_bytes_are_read_alike_or_are_one_line(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(21)
    text = json.dumps({"traceEvents": AWKWARD, "baseTimeNanoseconds": 1}).encode()
    read = 0
    for n in range(CASES):
        path = tmp_path / f"damaged-{n}.json"
        path.write_bytes(mutated(rng, text))
        got = read_both_ways(path, monkeypatch)
        if len(got) == 2 and all(isinstance(g, Timeline) for g in got):
            assert_same_timeline(*got)  # type: ignore[arg-type]
        read += isinstance(got[0], Timeline)
    assert 0 < read < CASES  # some damage leaves valid JSON, most does not


ODD: list[Any] = [None, True, -1, 0, 1e308, HUGE, -HUGE, 1.5, "1.5", "x", "", [], [1, [2]], {},
                  {"a": [None]}, "\u00e9\U0001f600", "<script>", "ProfilerStep#",
                  "ProfilerStep#-3", "nccl:all_reduce", "Memcpy HtoD (Pageable -> Device)"]


FIELDS = ["ph", "name", "cat", "ts", "dur", "tid", "pid", "args", "id"]


ARGS = ["External id", "correlation", "Collective name", "In msg nelems", "Out msg nelems",
        "dtype", "Group size", "bytes", "Total Allocated", "Total Reserved", "Input Dims",
        "Input type", "Input Strides", "stream", "device"]


def odd_typed(rng: random.Random, events: list[dict[str, Any]]) -> list[Any]:
    """``events`` (copied) with some fields and args given values of other types."""
    out: list[Any] = json.loads(json.dumps(events))
    for _ in range(rng.randint(1, 12)):
        ev = rng.choice(out)
        value = json.loads(json.dumps(rng.choice(ODD)))
        r = rng.random()
        if r < 0.5:
            ev[rng.choice(FIELDS)] = value
        elif r < 0.85 and isinstance(ev.setdefault("args", {}), dict):
            ev["args"][rng.choice(ARGS)] = value
        else:
            ev.pop(rng.choice(FIELDS), None)
    if rng.random() < 0.1:
        out.insert(rng.randrange(len(out)), rng.choice(ODD))
    return out


def test_fields_of_odd_types_through_the_whole_trace_door(tmp_path: Path) -> None:
    """The analysis and the JSON and text reports of each, or one line."""
    rng = random.Random(7)
    analysed = 0
    for n in range(60):
        top: dict[str, Any] = {"traceEvents": odd_typed(rng, AWKWARD * 2)}
        if rng.random() < 0.2:
            top[rng.choice(["distributedInfo", "deviceProperties", "baseTimeNanoseconds"])] = \
                rng.choice(ODD)
        path = tmp_path / f"odd-{n}.json"
        path.write_text(json.dumps(top))
        try:
            analysis = analyze_traces([path])
        except TraceError as err:
            assert "\n" not in str(err)
            continue
        json.loads(render_json(analysis))
        assert render_text(analysis, full=True)
        analysed += 1
    assert analysed > 30
