"""The C scanner (doctor.trace.scan) gives the timeline the per-event collector gives
(tests/reference_collector.py): on every recorded trace, on awkward events cut at every place by
small chunks and blocks, on events of unusual types (decoded the slow way), and it says what is
wrong with a broken file as the slow way does.

The sweeps here (tests/sweeps: every recorded trace, every place a trace can be cut, hundreds
of seeded damages) take tens of seconds; the quick tests are in tests/unit/test_scan.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from doctor.trace import scan
from doctor.trace.events import load_timeline
from tests.reference_collector import reference_timeline
from tests.trace_files import (
    AWKWARD,
    assert_same_timeline,
    recorded_traces,
    scanned,
    shared_traces,
    trace_id,
    write_events,
)

pytestmark = pytest.mark.skipif(not scan.AVAILABLE, reason="the C scanner is not built here "
                                "(pip install -e . builds it where a C compiler is)")


SHARED = shared_traces()


@pytest.mark.parametrize("path", recorded_traces(), ids=trace_id)
def test_every_recorded_trace_is_scanned_into_the_per_event_timeline(
        path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slow: list[int] = []
    real = scan._Walk.slow_events
    monkeypatch.setattr(scan._Walk, "slow_events", lambda self: slow.append(1) or real(self))
    assert_same_timeline(load_timeline(path), reference_timeline(path))
    assert not slow  # real traces are scanned whole, none of their events the slow way


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000, 4 << 20])
@pytest.mark.parametrize("block", [1, 3, 16384])
@pytest.mark.parametrize("seam", [1, 50, 64 << 10])
@pytest.mark.parametrize("layout", ["object", "bare", "indented", "gz"])
def test_awkward_events_cut_anywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     chunk: int, block: int, seam: int, layout: str) -> None:
    """Chunks of a byte cut every event, string, number and escape somewhere; blocks of one
    event make every event its own block; a seam shorter than an event joins the chunks."""
    monkeypatch.setattr(scan, "CHUNK_BYTES", chunk)
    monkeypatch.setattr(scan, "BLOCK_EVENTS", block)
    monkeypatch.setattr(scan, "SEAM_BYTES", seam)
    events = [dict(ev, ts=ev["ts"] + 100 * k) if isinstance(ev.get("ts"), int) else ev
              for k in range(3) for ev in AWKWARD]
    path = write_events(tmp_path / "t.json", events, bare=layout == "bare", gz=layout == "gz",
                        indent=2 if layout == "indented" else None)
    scanned(path)  # no NotScanned: the scanner read it (its odd events the slow way)
    assert_same_timeline(load_timeline(path), reference_timeline(path))
