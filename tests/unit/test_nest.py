"""The nesting of host ops in C (doctor/trace/_nest.c) gives what doctor.trace.ops' Python
loops give: each op's own time and the op that launched each runtime call, on every recorded
trace and on random nests of ops on several threads, with ties."""

from __future__ import annotations

import random

import numpy as np
import pytest

from doctor.trace import ops
from doctor.trace.events import EventArrays, build_timeline
from tests.trace_files import nest_both_ways

pytestmark = pytest.mark.skipif(ops._nest is None, reason="the C nesting is not built here "
                                "(pip install -e . builds it where a C compiler is)")


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
    fast, slow = nest_both_ways(monkeypatch, t)
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
