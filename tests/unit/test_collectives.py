"""What each collective moved (doctor.trace.collectives, doctor.trace.comm_calls): kinds by the
names traces give them, message bytes by hand, bus bandwidth as nccl-tests define it, and the
real traces' collectives against their own recorded message sizes."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import pytest

from doctor.trace.collectives import (
    COLLECTIVES,
    bus_factor,
    collective_args,
    kernel_kind_code,
    kind_code,
    message_bytes,
    tensors_bytes,
)
from doctor.trace.comm_calls import collective_calls
from doctor.trace.events import build_timeline, load_timeline
from tests.support import SHARED_TRACES


def kind(name: str) -> str:
    return COLLECTIVES[kind_code(name)]


def test_kinds_by_the_names_traces_give_them() -> None:
    assert kind("allreduce") == kind("nccl:all_reduce") == kind("gloo:all_reduce") == \
        kind("c10d::allreduce_") == "allreduce"
    assert kind("nccl:_all_gather_base") == kind("all_gather_into_tensor") == "allgather"
    assert kind("nccl:_reduce_scatter_base") == "reducescatter"
    assert kind("nccl:all_to_all") == "alltoall"
    assert kind("wait") == "other"
    assert COLLECTIVES[kernel_kind_code(
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)")] \
        == "allreduce"
    assert COLLECTIVES[kernel_kind_code("ncclDevKernel_AllGather_RING_LL(x)")] == "allgather"


def test_message_bytes_and_bus_factors_by_hand() -> None:
    args = {"In msg nelems": 1000, "Out msg nelems": 8000, "dtype": "BFloat16"}
    assert message_bytes(kind_code("allreduce"), args) == 2000
    assert message_bytes(kind_code("allgather"), args) == 16000  # the whole gathered output
    assert message_bytes(kind_code("allreduce"), {"In msg nelems": 10}) is None
    # _all_gather_base(output, input): the output is the message
    assert tensors_bytes([[8, 1024], [1024]], ["float", "float"]) == 8 * 1024 * 4
    assert tensors_bytes([[], [3]], ["Scalar", "long int"]) == 24
    assert bus_factor(kind_code("allreduce"), 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor(kind_code("allgather"), 4) == pytest.approx(3 / 4)
    assert bus_factor(kind_code("broadcast"), 16) == 1.0
    assert bus_factor(kind_code("allreduce"), 1) != bus_factor(kind_code("allreduce"), 1)  # nan
    assert collective_args("record_param_comms", {"Collective name": "allreduce",
                                                  "In msg nelems": 5, "dtype": "Float",
                                                  "Group size": 2}) == (1, 20, 2)


def test_a_gloo_collective_is_the_work_on_its_thread_not_the_call_that_enqueues_it() -> None:
    events = [  # as torch 2.13 records DDP over gloo: c10d enqueues, a gloo thread reduces
        {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "ts": 0, "dur": 5, "tid": 1,
         "args": {"Input Dims": [[[250]], [], []], "Input type": ["TensorList", "", ""]}},
        {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "ts": 10, "dur": 100,
         "tid": 7, "args": {"Input Dims": [[250]], "Input type": ["float"]}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 60, "dur": 100, "tid": 1},
    ]
    t = build_timeline(events)
    [row] = collective_calls(t).to_dict(orient="records")
    assert row["kind"] == "allreduce" and row["bytes"] == 1000
    assert row["seconds"] == pytest.approx(100e-6)
    assert row["exposed_s"] == pytest.approx(50e-6)  # the mm from 60 us on overlaps it
    assert row["alg_bytes_s"] == pytest.approx(1000 / 100e-6)
    assert row["group"] == -1  # neither the op nor the trace says


def test_nested_communication_ops_are_one_collective() -> None:
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": 0, "dur": 100, "tid": 1,
         "args": {"Collective name": "allreduce", "In msg nelems": 250, "dtype": "Float",
                  "Group size": 2}},
        {"ph": "X", "cat": "user_annotation", "name": "nccl:all_reduce", "ts": 10, "dur": 80,
         "tid": 1, "args": {}},
    ]
    [row] = collective_calls(build_timeline(events)).to_dict(orient="records")
    assert row["bytes"] == 1000 and row["group"] == 2
    assert row["bus_bytes_s"] == pytest.approx(1000 / 100e-6)  # 2(n-1)/n = 1 for n = 2


def _events(name: str) -> list[dict]:
    path = SHARED_TRACES / name
    if not path.is_file():
        pytest.skip(f"{path} is not here (../shared/traces)")
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


def test_nccl_kernels_carry_their_message_in_a_newer_trace() -> None:
    name = "ddp_a100_rank0_of_2_hostbound.json.gz"
    raw = [e for e in _events(name) if e.get("cat") == "kernel" and
           e.get("args", {}).get("Collective name") == "allreduce"]
    calls = collective_calls(load_timeline(SHARED_TRACES / name))
    ours = calls[calls["kind"] == "allreduce"]
    assert sorted(ours["bytes"]) == sorted(e["args"]["In msg nelems"] * 4 for e in raw)
    first = min(raw, key=lambda e: e["ts"])
    nbytes, seconds = first["args"]["In msg nelems"] * 4, first["dur"] * 1e-6
    row = ours.sort_values("start_us").iloc[0]
    assert row["alg_bytes_s"] == pytest.approx(nbytes / seconds, rel=1e-6)
    assert row["bus_bytes_s"] == pytest.approx(nbytes / seconds * 2 * 1 / 2, rel=1e-6)


def test_kernels_without_arguments_take_the_message_of_the_op_that_launched_them() -> None:
    name = "recsys_a100_rank3_of_8.json.gz"
    dims = Counter()
    for e in _events(name):
        if e.get("name") == "nccl:all_reduce" and "Input Dims" in e.get("args", {}):
            [shape] = e["args"]["Input Dims"]
            assert e["args"]["Input type"] == ["float"]
            n = 1
            for x in shape:
                n *= x
            dims[n * 4] += 1
    calls = collective_calls(load_timeline(SHARED_TRACES / name))
    assert Counter(calls.loc[calls["kind"] == "allreduce", "bytes"]) == dims
    # all-to-all runs as SendRecv kernels: the launching op names the collective
    assert (calls["kind"] == "alltoall").sum() == 42 and (calls["kind"] == "sendrecv").sum() == 0
    assert set(calls["group"]) == {8}  # distributedInfo's world size


def test_ddps_reducer_work_on_the_training_thread_is_communication() -> None:
    from doctor.trace.steps import step_frame_from_timeline

    def op(name: str, ts: float, dur: float, tid: int, cat: str = "cpu_op") -> dict:
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid,
                "args": {}}

    events = [
        op("ProfilerStep#1", 0, 1000, 1, "user_annotation"),
        op("aten::mm", 0, 300, 1),  # backward's compute
        # DDP divides a gradient by the world size: 200 us of the training thread's time
        op("torch::distributed::reducer::mul_out", 300, 200, 1, "user_annotation"),
        op("aten::mul", 310, 180, 1),
        # gloo reduces on its own thread: beside the mm for 100 us, then alone
        op("gloo:all_reduce", 200, 700, 7, "user_annotation"),
    ]
    [row] = step_frame_from_timeline(build_timeline(events), 0).to_dict(orient="records")
    # exposed: the reducer's 200 us, and the all-reduce from 500 to 900 us with nothing beside
    assert row["comm_exposed_s"] == pytest.approx(600e-6)
    assert row["excl_communication_s"] == pytest.approx(600e-6)
    assert row["excl_compute_s"] == pytest.approx(300e-6)
