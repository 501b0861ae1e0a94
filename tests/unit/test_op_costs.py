"""Operation counts and bytes of ops by their shapes (doctor.trace.op_costs), against numbers
worked out by hand, and on the shapes real traces recorded."""

from __future__ import annotations

import pytest

from doctor.trace.op_costs import KIND_CONV, KIND_ELEMENTWISE, KIND_MATMUL, op_cost
from doctor.trace.reader import iter_events
from tests.support import SHARED_TRACES


def test_a_matrix_product_by_hand() -> None:
    # addmm(bias[64], x[4096, 100], w[100, 64]): 2*M*K*N operations; bytes of x, w, bias, out
    cost = op_cost("aten::addmm", [[64], [4096, 100], [100, 64], [], []],
                   ["float", "float", "float", "Scalar", "Scalar"])
    assert cost is not None and cost.kind == KIND_MATMUL and cost.dtype == "fp32"
    assert cost.flops == 2 * 4096 * 100 * 64
    assert cost.bytes == 4 * (64 + 4096 * 100 + 100 * 64) + 4 * 4096 * 64
    bmm = op_cost("aten::bmm", [[8, 128, 64], [8, 64, 128]], ["c10::BFloat16"] * 2)
    assert bmm is not None and bmm.dtype == "bf16"
    assert bmm.flops == 2 * 8 * 128 * 64 * 128
    assert bmm.bytes == 2 * (2 * 8 * 128 * 64) + 2 * 8 * 128 * 128


def test_composite_ops_are_not_counted_twice() -> None:
    assert op_cost("aten::linear", [[4096, 100], [64, 100], [64]], ["float"] * 3) is None
    assert op_cost("aten::matmul", [[4096, 100], [100, 64]], ["float"] * 2) is None


def test_convolution_and_its_backward() -> None:
    # x[32, 64, 56, 56], w[128, 64, 3, 3]: output taken as [32, 128, 56, 56] (stride 1)
    fwd = op_cost("aten::convolution", [[32, 64, 56, 56], [128, 64, 3, 3], [128], [], [], [],
                                        [], [], []], ["float"] * 3 + [""] * 6)
    assert fwd is not None and fwd.kind == KIND_CONV and fwd.estimated
    assert fwd.flops == 2 * (32 * 128 * 56 * 56) * (64 * 3 * 3)
    # backward: the incoming gradient gives the output's true size (stride 2 here)
    bwd = op_cost("aten::convolution_backward",
                  [[32, 128, 28, 28], [32, 64, 56, 56], [128, 64, 3, 3]], ["float"] * 3)
    assert bwd is not None and not bwd.estimated
    assert bwd.flops == 2 * 2 * (32 * 128 * 28 * 28) * (64 * 3 * 3)


def test_elementwise_ops_are_one_operation_an_element_and_low_intensity() -> None:
    add = op_cost("aten::add", [[1024, 1024], [1024, 1024], []], ["float", "float", "Scalar"])
    assert add is not None and add.kind == KIND_ELEMENTWISE
    assert add.flops == 1024 * 1024
    assert add.bytes == 3 * 4 * 1024 * 1024  # two read, one written
    relu_ = op_cost("aten::relu_", [[1024, 1024]], ["float"])
    assert relu_ is not None and relu_.bytes == 4 * 1024 * 1024  # in place: written over
    gemm = op_cost("aten::mm", [[1024, 1024], [1024, 1024]], ["float"] * 2)
    assert gemm is not None and gemm.intensity > 100 * add.intensity


def test_unknown_ops_and_odd_shapes_have_no_cost() -> None:
    assert op_cost("aten::my_custom_op", [[4, 4]], ["float"]) is None
    assert op_cost("aten::mm", [[4, 5], [6, 7]], ["float"] * 2) is None  # K does not match
    assert op_cost("aten::mm", "not dims", None) is None


@pytest.mark.skipif(not SHARED_TRACES.is_dir(),
                    reason=f"the recorded traces are not here ({SHARED_TRACES})")
def test_the_gemms_of_a_real_trace() -> None:
    """Every mm and addmm the A100 trace recorded with shapes costs 2*M*K*N, by hand from its
    dims (addmm's bias first)."""
    seen = {"aten::mm": 0, "aten::addmm": 0}
    for ev in iter_events(SHARED_TRACES / "a100_rank0_of_16_pageable.json.gz"):
        name = ev.get("name")
        if name not in seen or "Input Dims" not in ev.get("args", {}):
            continue
        dims = ev["args"]["Input Dims"]
        cost = op_cost(name, dims, ev["args"]["Input type"])
        (m, k), (_, n) = dims[-2:] if name == "aten::mm" else dims[1:3]
        assert cost is not None and cost.flops == 2 * m * k * n
        seen[name] += 1
    assert seen["aten::mm"] > 10 and seen["aten::addmm"] >= 10


def test_a_convolutions_input_layout_from_its_strides() -> None:
    from doctor.trace.op_costs import LAYOUT_NCHW, LAYOUT_NHWC, conv_layout

    dims = [[32, 64, 56, 56], [128, 64, 3, 3], [], [], [], [], [], [], []]
    nchw = [[64 * 56 * 56, 56 * 56, 56, 1], [576, 9, 3, 1]]
    nhwc = [[64 * 56 * 56, 1, 56 * 64, 64], [576, 1, 192, 64]]
    assert conv_layout("aten::cudnn_convolution", dims, nchw) == LAYOUT_NCHW
    assert conv_layout("aten::convolution_backward", dims, nhwc) == LAYOUT_NHWC
    # one channel: both formats have the same strides, so neither can be told
    assert conv_layout("aten::convolution", [[8, 1, 28, 28]], [[784, 784, 28, 1]]) == 0
    assert conv_layout("aten::mm", dims, nchw) == 0
    assert conv_layout("aten::conv1d", [[8, 3, 100]], [[300, 100, 1]]) == 0
