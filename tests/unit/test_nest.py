"""The nesting of host ops in C (doctor/trace/_nest.c) gives what doctor.trace.ops' Python
loops give: each op's own time and the op that launched each runtime call, on every shared
trace and on random nests of ops on several threads, with ties."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from doctor.trace import ops
from doctor.trace.events import EventArrays, Timeline, build_timeline, load_timeline
from tests.trace_files import shared_traces

SHARED = shared_traces()

pytestmark = pytest.mark.skipif(ops._nest is None, reason="the C nesting is not built here "
                                "(pip install -e . builds it where a C compiler is)")


def both(monkeypatch: pytest.MonkeyPatch, t: Timeline) -> tuple[list[np.ndarray], ...]:
    fast = [ops._self_us(t.host_ops.start, t.host_ops.end, t.host_ops.attrs["tid"]),
            ops._launching_ops(t)]
    with monkeypatch.context() as m:
        m.setattr(ops, "_nest", None)
        slow = [ops._self_us(t.host_ops.start, t.host_ops.end, t.host_ops.attrs["tid"]),
                ops._launching_ops(t)]
    return fast, slow


@pytest.mark.skipif(not SHARED, reason="the shared traces are not beside this checkout")
@pytest.mark.parametrize("path", SHARED, ids=lambda p: p.name)
def test_every_shared_trace_nests_as_the_loops_say(path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    fast, slow = both(monkeypatch, load_timeline(path))
    for a, b in zip(fast, slow, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("seed", range(20))
def test_random_nests_on_several_threads(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    events = []
    for tid in range(1, 4):
        def nest(lo: int, hi: int, depth: int, tid: int = tid) -> None:
            t = lo
            while t < hi and depth < 5:
                start = t + rng.randrange(0, 3)
                end = min(hi, start + rng.randrange(0, 12))  # zero-length and equal ends too
                if end < start:
                    break
                events.append({"ph": "X", "cat": "cpu_op", "name": f"op{depth}", "ts": start,
                               "dur": end - start, "tid": tid})
                if rng.random() < 0.5:
                    events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                                   "ts": rng.randrange(start, end + 1), "dur": 0, "tid": tid})
                nest(start, end, depth + 1)
                t = end + rng.randrange(0, 2)
        nest(0, 200, 0)
    events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaMalloc", "ts": 5, "dur": 1,
                   "tid": 99})  # a thread without ops
    t = build_timeline(events)
    assert len(t.host_ops) > 20 and len(t.runtime) > 5
    fast, slow = both(monkeypatch, t)
    for a, b in zip(fast, slow, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_negative_thread_code_is_left_to_the_loops() -> None:
    arrays = EventArrays(np.array([0.0, 1.0]), np.array([5.0, 2.0]),
                         {"tid": np.array([-1, -1], np.int32)})
    own = np.array([5.0, 1.0])
    assert ops._nest is not None
    assert not ops._nest.self_times(arrays.start, arrays.end, arrays.attrs["tid"], own)
    assert own.tolist() == [5.0, 1.0]
    np.testing.assert_array_equal(ops._self_us(arrays.start, arrays.end, arrays.attrs["tid"]),
                                  [4.0, 1.0])
