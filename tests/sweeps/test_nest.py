"""The nesting of host ops in C (doctor/trace/_nest.c) gives what doctor.trace.ops' Python
loops give: each op's own time and the op that launched each runtime call, on every recorded
trace and on random nests of ops on several threads, with ties.

The sweeps here (tests/sweeps: every recorded trace, every place a trace can be cut, hundreds
of seeded damages) take tens of seconds; the quick tests are in tests/unit/test_nest.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from doctor.trace import ops
from doctor.trace.events import load_timeline
from tests.trace_files import nest_both_ways, recorded_traces, shared_traces, trace_id

pytestmark = pytest.mark.skipif(ops._nest is None, reason="the C nesting is not built here "
                                "(pip install -e . builds it where a C compiler is)")


SHARED = shared_traces()


@pytest.mark.parametrize("path", recorded_traces(), ids=trace_id)
def test_every_recorded_trace_nests_as_the_loops_say(path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    fast, slow = nest_both_ways(monkeypatch, load_timeline(path))
    for a, b in zip(fast, slow, strict=True):
        np.testing.assert_array_equal(a, b)
