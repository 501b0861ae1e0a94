"""doctor.trace has one entry point (doctor.trace.tables.read_traces): a run's own profiler
window and a trace analysed on its own read their traces through it, and get the same frames of
the same trace."""

from __future__ import annotations

import ast
from pathlib import Path

import pandas as pd
import pytest

from doctor.errors import WindowUnavailable
from doctor.store.traces import load_traces
from doctor.store.windows import read_window
from tests.support import ROOT, SHARED_TRACES

TRACES = SHARED_TRACES
SHARED = ["ddp_v100_rank1_of_2.json.gz", "a100_rank0_of_16_pageable.json.gz"]

#: What reads a trace, or builds a table of one, inside doctor.trace: only the entry point
#: (doctor/trace/tables.py) calls these from outside the package.
READERS = {"load_timeline", "load_timeline_parallel", "read_timelines", "step_frame_from_timeline",
           "op_table", "collective_calls", "window_events", "build_timeline"}


def _shared(name: str) -> Path:
    path = TRACES / name
    if not path.is_file():
        pytest.skip("the shared traces are not beside this checkout")
    return path


def _without(frame: pd.DataFrame, *columns: str) -> pd.DataFrame:
    return frame.drop(columns=[c for c in columns if c in frame]).reset_index(drop=True)


@pytest.mark.parametrize("name", SHARED)
def test_both_doors_get_the_same_frames_of_a_trace(name: str) -> None:
    path = _shared(name)
    run = load_traces([path])
    rank = int(run.processes["rank"].iloc[0])
    window = read_window(path, rank)  # the run directory's door, as doctor.store.reader calls it
    pd.testing.assert_frame_equal(_without(run.window, "node", "pid"),
                                  _without(window.steps, "node", "pid"), check_dtype=False)
    who = ("node", "rank", "pid")
    pd.testing.assert_frame_equal(_without(run.ops, *who), _without(window.ops, *who),
                                  check_dtype=False)
    pd.testing.assert_frame_equal(_without(run.collectives, *who),
                                  _without(window.calls, *who), check_dtype=False)
    assert len(window.events) and window.events_total >= len(window.events)


def test_the_entry_point_gives_each_trace_its_own_rank_or_the_one_given() -> None:
    from doctor.trace.tables import read_traces

    path = _shared(SHARED[0])
    [own] = read_traces([path])
    [given] = read_traces([path], [7])
    assert own.rank == 1 and given.rank == 7  # rank 1 of 2, by its distributedInfo
    assert set(given.steps["rank"]) == {7}
    assert own.events.empty and own.events_total == 0  # events only when asked
    pd.testing.assert_frame_equal(own.ops, given.ops)


def test_a_trace_without_steps_says_why_through_both_doors(tmp_path: Path) -> None:
    from doctor.trace.tables import read_traces

    path = tmp_path / "empty.json"
    path.write_text('{"traceEvents": []}')
    [tables] = read_traces([path])
    assert tables.steps.empty and tables.no_step_reason == "the trace has no events"
    status = load_traces([path]).window_status
    assert list(status["reason"]) == ["the trace has no events"]
    with pytest.raises(WindowUnavailable, match="no profiled step"):
        read_window(path, 0)


def test_only_the_entry_point_reads_traces_outside_doctor_trace() -> None:
    """Outside doctor/trace/, no module of doctor calls the trace's readers or table builders
    by themselves: they go through doctor.trace.tables."""
    found = []
    for folder in ("doctor", "probes", "reports"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.is_relative_to(ROOT / "doctor" / "trace"):
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ImportFrom) and "trace" in (node.module or "").split("."):
                    found += [f"{path.relative_to(ROOT)}:{node.lineno} {a.name}"
                              for a in node.names if a.name in READERS]
    assert not found, "read traces through doctor.trace.tables.read_traces:\n" + "\n".join(found)
