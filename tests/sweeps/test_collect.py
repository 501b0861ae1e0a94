"""The block collector (doctor.trace.collect) gives the timeline the per-event one gave
(tests/reference_collector.py), on every recorded trace and on events made to be awkward: every
kind's times and columns, the steps, the threads; names compared as text (their codes may be
given in another order).

The sweeps here (tests/sweeps: every recorded trace, every place a trace can be cut, hundreds
of seeded damages) take tens of seconds; the quick tests are in tests/unit/test_collect.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from doctor.trace import events as events_module
from doctor.trace import reader
from doctor.trace.events import load_timeline
from doctor.trace.parallel import load_timeline_parallel
from tests.reference_collector import reference_timeline
from tests.trace_files import assert_same_timeline, recorded_traces, shared_traces, trace_id

SHARED = shared_traces()


@pytest.mark.parametrize("path", recorded_traces(), ids=trace_id)
def test_every_recorded_trace_gives_the_per_event_timeline(path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Read by msgspec's typed blocks (the C scanner's own test: tests/sweeps/test_scan.py)."""
    monkeypatch.setattr(events_module, "SCANNER", False)
    assert_same_timeline(load_timeline(path), reference_timeline(path))


@pytest.mark.parametrize("path", [p for p in SHARED if p.stat().st_size > 1 << 20][:2] or
                         [None], ids=lambda p: p.name if p else "none")
def test_a_trace_read_on_several_cores_gives_the_same_timeline(path: Path | None,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    if path is None:
        pytest.skip("the shared traces are not beside this checkout")
    monkeypatch.setattr(reader, "BLOCK_CHARS", 256 << 10)  # many blocks, on both workers
    assert_same_timeline(load_timeline_parallel(path, 2), reference_timeline(path))
