"""The block collector (doctor.trace.collect) gives the timeline the per-event one gave
(tests/reference_collector.py), on every recorded trace and on events made to be awkward: every
kind's times and columns, the steps, the threads; names compared as text (their codes may be
given in another order).

The tests here start jobs, processes or real clocks (tests/e2e); the pure ones are in
tests/unit/test_collect.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from doctor.trace.parallel import load_timeline_parallel
from tests.reference_collector import reference_timeline
from tests.trace_files import AWKWARD, assert_same_timeline, write_events


def _stuck(text: str) -> None:
    import time

    time.sleep(5)


def test_a_block_that_never_comes_back_is_read_again_here(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """A worker killed (out of memory) loses its block without a word from the pool: after a
    while the trace is read again one block after the other, not waited for forever."""
    from doctor.trace import parallel

    monkeypatch.setattr(parallel, "_collect", _stuck)
    monkeypatch.setattr(parallel, "BLOCK_TIMEOUT_S", 0.2)
    path = write_events(tmp_path / "t.json", AWKWARD * 3)
    assert_same_timeline(load_timeline_parallel(path, 2), reference_timeline(path))
