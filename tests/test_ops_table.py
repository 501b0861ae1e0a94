"""The ops table of a trace (doctor.trace.ops): own host time with nested ops taken out,
kernels and copies tied to the op that launched them, costs summed by op name."""

from __future__ import annotations

import pytest

from doctor.trace.events import build_timeline
from doctor.trace.ops import op_table
from tests.test_doors import TRACES


def op(name: str, ts: float, dur: float, tid: int = 1, **args: object) -> dict[str, object]:
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "tid": tid,
            "args": args}


def test_nested_ops_and_the_kernels_they_launch() -> None:
    mm_dims = {"Input Dims": [[64], [128, 256], [256, 32], [], []],
               "Input type": ["float", "float", "float", "Scalar", "Scalar"]}
    events = [
        op("aten::linear", 0, 100),
        op("aten::addmm", 10, 80, **mm_dims),  # inside linear
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 20, "dur": 5,
         "tid": 1, "args": {"correlation": 7}},
        {"ph": "X", "cat": "kernel", "name": "sgemm_128x64", "ts": 30, "dur": 400, "tid": 9,
         "args": {"correlation": 7}},
        op("aten::relu", 200, 30),
        op("aten::addmm", 300, 50, **mm_dims),  # a second call, launching nothing
    ]
    table = op_table(build_timeline(events)).set_index("op")
    assert table.loc["aten::linear", "self_s"] == pytest.approx(20e-6)  # 100 less its child
    assert table.loc["aten::addmm", "self_s"] == pytest.approx(130e-6)
    assert table.loc["aten::addmm", "calls"] == 2
    assert table.loc["aten::addmm", "device_s"] == pytest.approx(400e-6)  # the kernel is its
    assert table.loc["aten::linear", "device_s"] == 0
    assert table.loc["aten::addmm", "flops"] == 2 * (2 * 128 * 256 * 32)
    assert table.loc["aten::addmm", "kind"] == "matmul"
    assert table.index[0] == "aten::addmm"  # a GPU trace: the most device time first


@pytest.mark.skipif(not TRACES.is_dir(), reason=f"the recorded traces are not here ({TRACES})")
def test_a_real_trace_ties_its_kernels_to_ops() -> None:
    from doctor.trace.events import load_timeline

    t = load_timeline(TRACES / "resnet_v100_compute.pt.trace.json.gz")
    table = op_table(t)
    kernels = float((t.kernels.end - t.kernels.start).sum()) * 1e-6
    copies = float((t.memcpy.end - t.memcpy.start).sum()) * 1e-6
    # every kernel and copy of this trace was launched inside some op
    assert table["device_s"].sum() == pytest.approx(kernels + copies, rel=0.02)
    assert set(table["op"].head(2)) == {"aten::convolution_backward", "aten::cudnn_convolution"}
