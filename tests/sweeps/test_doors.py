"""The run door (a run directory) and the trace door (traces on their own) give one verdict.

Each case is recorded twice from the same made-up job: as a run directory written through a real
Session (fake clock), with the same job's profiler window as its trace, and as that trace alone.

The sweeps here (tests/sweeps: every recorded trace, every place a trace can be cut, hundreds
of seeded damages) take tens of seconds; the quick tests are in tests/unit/test_doors.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from doctor.pipeline import analyze_run, analyze_traces
from doctor.store.layout import process_dir
from tests.support import write_record
from tests.trace_files import recorded_traces, trace_id


@pytest.mark.parametrize("trace", recorded_traces(), ids=lambda p: trace_id(p, folders=True))
def test_a_recorded_trace_gives_one_verdict_as_a_trace_and_as_a_run_directory(
        tmp_path: Path, trace: Path) -> None:
    """The trace as its own RunData, and the same trace as the only record of a run directory's
    training process: one pipeline, one answer."""
    alone = analyze_traces([trace]).verdict
    proc = process_dir(tmp_path, 0, "main", 4242)
    proc.mkdir(parents=True)
    (proc / "trace.json.gz").write_bytes(trace.read_bytes())
    (proc / "meta.json").write_text(json.dumps({"pid": 4242, "rank": 0, "role": "main",
                                                "window": {"state": "done"}}))
    write_record(tmp_path, cores=8)
    as_run = analyze_run(tmp_path).verdict
    assert as_run.bottleneck == alone.bottleneck
    assert as_run.shares == pytest.approx(alone.shares, abs=1e-9)
    assert {f.id for f in alone.findings} - {"trace.cpu_only", "input.unsplit"} <= \
        {f.id for f in as_run.findings}
