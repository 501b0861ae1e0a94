"""Trace files for the tests: writing events as a Kineto trace, events made to be awkward for a
reader, the comparison of a timeline with the per-event oracle's (reference_collector), and the
recorded traces the tests read: those committed in tests/data/traces/ and, when they are beside
the checkout, the real GPU traces of ../shared/traces/.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from doctor.errors import TraceError
from doctor.trace import events as events_module
from doctor.trace import ops, scan
from doctor.trace.budget import EventBudget
from doctor.trace.collect import COLUMN_TYPES, BlockCollector
from doctor.trace.events import Timeline, load_timeline
from tests.support import DATA_TRACES, SHARED_TRACES


def data_traces() -> list[Path]:
    """The recorded traces committed with the tests (always there; not the damaged ones)."""
    return sorted(DATA_TRACES.glob("*.json.gz"))


def shared_traces() -> list[Path]:
    """The real GPU traces of ../shared/traces; none when they are not beside this checkout."""
    return sorted(SHARED_TRACES.glob("**/*.json.gz")) if SHARED_TRACES.is_dir() else []


def recorded_traces() -> list[Path]:
    """The committed traces, then the shared ones where they are."""
    return data_traces() + shared_traces()


def trace_id(path: Path, *, folders: bool = False) -> str:
    """How a test names a recorded trace: ``data/NAME`` for a committed one; a shared one by its
    file name, or with ``folders`` by its path under ../shared/traces."""
    if path.parent == DATA_TRACES:
        return f"data/{path.name}"
    return str(path.relative_to(SHARED_TRACES)) if folders else path.name


def write_trace(path: Path, payload: Any, gz: bool = False, raw: str | None = None) -> Path:
    text = raw if raw is not None else json.dumps(payload)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


TRICKY: list[dict[str, Any]] = [
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 5,
     "args": {"Input Dims": [[2, 3], [3, 4]], "Input type": ["float", "float"]}},
    {"ph": "X", "cat": "kernel", "name": 'sgemm "}, {" },\n{', "pid": 0, "tid": "stream 7",
     "ts": 12.5, "dur": 3.25, "args": {"correlation": 9, "note": "}, {\"ph\": \"X\"}"}},
    # args first, not last: "}, " inside the event, before more keys
    {"args": {"correlation": 11, "nested": [{"a": 1}, {"b": [{"c": 2}]}]}, "ph": "X",
     "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 11, "dur": 1, "tid": 1},
    {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "ts": 13, "pid": 1, "tid": 1,
     "args": {"Device Type": 1, "Device Id": 0, "Total Allocated": 2**40, "Total Reserved": 2**41}},
    # unusual types: the block is read again by the standard library
    {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": "14.5", "dur": "2", "tid": 1.0},
    {"ph": "X", "cat": "cpu_op", "name": 17, "ts": 15, "dur": 1, "tid": True, "args": [1, 2]},
    {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "ts": 16,
     "dur": 4, "tid": "stream 7", "args": {"bytes": 4096, "correlation": 12}},
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "ts": 9, "dur": 20, "tid": 1},
]


#: The events msgspec decodes typed (the others make their block fall back).
CLEAN = [ev for ev in TRICKY if (not isinstance(ev.get("ts"), str) and "args" not in ev)
         or (isinstance(ev.get("args"), dict) and not isinstance(ev.get("ts"), str))]


def write_events(path: Path, events: list[dict[str, Any]], *, bare: bool = False, gz: bool = False,
                 indent: int | None = None) -> Path:
    payload: Any = events if bare else {"schemaVersion": 1, "traceEvents": events,
                                        "baseTimeNanoseconds": 1_700_000_000_000_000_000}
    return write_trace(path, None, gz, raw=json.dumps(payload, indent=indent))


KINDS = ("optimizer_steps", "host_ops", "python", "dataloader", "comm_ops", "comm_kernels",
         "kernels", "memcpy", "memset", "runtime", "memory")


def assert_same_timeline(got: Timeline, want: Timeline) -> None:
    assert got.steps == want.steps
    assert (got.origin_us, got.first_us, got.last_us) == (want.origin_us, want.first_us,
                                                         want.last_us)
    assert got.tids == want.tids
    assert got.meta == want.meta
    for kind in KINDS:
        a, b = getattr(got, kind), getattr(want, kind)
        np.testing.assert_array_equal(a.start, b.start, err_msg=kind)
        np.testing.assert_array_equal(a.end, b.end, err_msg=kind)
        assert list(a.attrs) == list(b.attrs), kind
        for key, values in a.attrs.items():
            assert values.dtype == COLUMN_TYPES[key], f"{kind}.{key}"  # the reference's: int64
            if key == "name":
                assert [got.names[c] for c in values] == [want.names[c] for c in
                                                          b.attrs[key]], f"{kind}.{key}"
            else:
                np.testing.assert_array_equal(values, b.attrs[key], err_msg=f"{kind}.{key}")


AWKWARD: list[dict[str, Any]] = [
    *TRICKY,
    {"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#x", "ts": 1, "dur": 2, "tid": 4},
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "ts": 8, "dur": 30,
     "tid": 1},  # the same step again, earlier: it wins
    {"ph": "X", "cat": "cpu_op", "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter"
     ".__next__", "ts": 20, "dur": 3, "tid": 9},
    {"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#SGD.step", "ts": 21, "dur": 2,
     "tid": 5},
    {"ph": "X", "cat": "cpu_op", "name": "nccl:all_reduce", "ts": 22, "dur": 2, "tid": 5,
     "args": {"Collective name": "allreduce", "In msg nelems": 10, "dtype": "Float",
              "Group size": 2}},
    {"ph": "X", "cat": "user_annotation", "name": "c10d::allreduce_", "ts": 22, "dur": 1,
     "tid": 6},
    {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ts": 23,
     "dur": 5, "tid": "stream 20", "args": {"correlation": 40}},
    {"ph": "X", "cat": "gpu_user_annotation", "name": "Optimizer.step#SGD.step", "ts": 24,
     "dur": 1, "tid": "stream 7"},
    {"ph": "X", "cat": "python_function", "name": "train.py(10): <module>", "ts": 2, "dur": 50,
     "tid": 1},
    {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler", "ts": 0, "dur": 1000},
    {"ph": "X", "cat": "cpu_op", "name": "aten::convolution", "ts": 30, "dur": 4, "tid": 1,
     "args": {"Input Dims": [[8, 3, 32, 32], [16, 3, 3, 3], [], [], [], [], [], [], []],
              "Input type": ["c10::Half", "c10::Half"],
              "Input Strides": [[3072, 1, 96, 3], [27, 1, 9, 3]]}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "ts": 31, "dur": -1, "tid": 1},
    {"ph": "X", "cat": None, "name": None, "ts": 32, "dur": 1, "tid": None},
    {"ph": "X", "cat": "kernel", "name": "volta_sgemm_128x64_nn", "ts": 33, "dur": 1,
     "tid": 7, "args": {"correlation": "12"}},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 34, "dur": 9,
     "tid": 1},
    {"ph": "f", "cat": "ac2g", "name": "ac2g", "ts": 35, "id": 3, "bp": "e"},
    {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "ts": 36, "dur": 1,
     "tid": "stream 7"},
]


#: An integer past 64 bits.
HUGE = 2**70


def scanned(path: Path) -> BlockCollector:
    """The collector the scanner filled (NotScanned if it could not)."""
    col = BlockCollector()
    scan.load_scanned(path, col, EventBudget())
    return col


def nest_both_ways(monkeypatch: pytest.MonkeyPatch, t: Timeline) -> tuple[list[np.ndarray], ...]:
    """Each op's own time and the op that launched each runtime call, by the C nesting and by
    the Python loops."""
    fast = [ops._self_us(t.host_ops.start, t.host_ops.end, t.host_ops.attrs["tid"]),
            ops._launching_ops(t)]
    with monkeypatch.context() as m:
        m.setattr(ops, "_nest", None)
        slow = [ops._self_us(t.host_ops.start, t.host_ops.end, t.host_ops.attrs["tid"]),
                ops._launching_ops(t)]
    return fast, slow


def read_both_ways(path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Timeline | str]:
    """What the scanner (where built) and the slow way make of ``path``: a timeline, or the
    one-line message of the TraceError."""
    got: list[Timeline | str] = []
    for scanner in ((True, False) if scan.AVAILABLE else (False,)):
        monkeypatch.setattr(events_module, "SCANNER", scanner)
        try:
            got.append(load_timeline(path))
        except TraceError as err:
            assert "\n" not in str(err) and path.name in str(err)
            got.append(str(err))
    return got
