"""The ops table of a trace (doctor.trace.ops): own host time with nested ops taken out,
kernels and copies tied to the op that launched them, costs summed by op name."""

from __future__ import annotations

import pytest

from doctor.trace.events import build_timeline
from doctor.trace.ops import op_table
from tests.support import SHARED_TRACES


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


@pytest.mark.skipif(not SHARED_TRACES.is_dir(),
                    reason=f"the recorded traces are not here ({SHARED_TRACES})")
def test_a_real_trace_ties_its_kernels_to_ops() -> None:
    from doctor.trace.events import load_timeline

    t = load_timeline(SHARED_TRACES / "resnet_v100_compute.pt.trace.json.gz")
    table = op_table(t)
    kernels = float((t.kernels.end - t.kernels.start).sum()) * 1e-6
    copies = float((t.memcpy.end - t.memcpy.start).sum()) * 1e-6
    # every kernel and copy of this trace was launched inside some op
    assert table["device_s"].sum() == pytest.approx(kernels + copies, rel=0.02)
    assert set(table["op"].head(2)) == {"aten::convolution_backward", "aten::cudnn_convolution"}


def test_transposes_belong_to_the_convolution_and_strides_give_its_layout() -> None:
    from doctor.trace.kinds import K_GEMM, K_LAYOUT, K_OTHER, kernel_kind

    assert kernel_kind("void cudnn::ops::nchwToNhwcKernel<float, float, float, false>") \
        == K_LAYOUT
    assert kernel_kind("void cudnn::ops::nhwcToNchwKernel<float, float, float, true>") \
        == K_LAYOUT
    assert kernel_kind("void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 512>") \
        == K_OTHER  # cuDNN's, but batch normalisation, not a GEMM
    assert kernel_kind("volta_scudnn_128x64_relu_interior_nn_v1") == K_GEMM
    conv = {"Input Dims": [[32, 64, 56, 56], [128, 64, 3, 3], [], [], [], [], [], [], []],
            "Input type": ["float", "float", "", "ScalarList", "ScalarList", "ScalarList",
                           "Scalar", "Scalar", "Scalar"],
            "Input Strides": [[64 * 56 * 56, 56 * 56, 56, 1], [576, 9, 3, 1], [], [], [], [],
                              [], [], []]}
    launch = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "dur": 2, "tid": 1}
    kernel = {"ph": "X", "cat": "kernel", "tid": 9}
    events = [
        op("aten::cudnn_convolution", 0, 100, **conv),
        {**launch, "ts": 10, "args": {"correlation": 1}},
        {**kernel, "name": "void cudnn::ops::nchwToNhwcKernel<float>", "ts": 20, "dur": 30,
         "args": {"correlation": 1}},
        {**launch, "ts": 20, "args": {"correlation": 2}},
        {**kernel, "name": "sm80_xmma_fprop_implicit_gemm_tf32", "ts": 50, "dur": 200,
         "args": {"correlation": 2}},
    ]
    row = op_table(build_timeline(events)).set_index("op").loc["aten::cudnn_convolution"]
    assert row["device_s"] == pytest.approx(230e-6)
    assert row["layout_s"] == pytest.approx(30e-6)
    assert row["nchw_calls"] == 1 and row["nhwc_calls"] == 0
