"""What an operator costs by its shapes: floating-point operations and bytes moved, from the
``Input Dims`` and ``Input type`` a trace records with ``record_shapes=True``.

Only the ops that do the work are counted, so that a composite op and the ops it calls are not
counted twice: matrix products (``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``mv``, ``addmv``,
``dot``), convolutions (forward and backward; without the output's size in the trace, the output
is taken as large as the input: stride 1, same padding, an upper bound for strided ones),
elementwise ops (one operation per output element), normalisations and softmax (a few per
element) and copies (no operations, every byte read and written). ``linear``, ``matmul``,
``conv2d`` and the like call those and are not counted themselves. Bytes are the inputs' and
the output's, each read or written once: a lower bound of the traffic, exact for a kernel that
streams them. An op with other names, or with shapes that do not fit its formula, has no cost
(None), and is left to its measured time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: Bytes per element of the type names traces write ("Input type").
DTYPE_BYTES: dict[str, int] = {
    "double": 8, "float": 4, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4,
    "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1,
    "c10::complex<float>": 8, "c10::complex<double>": 16,
    "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1,
}
#: The dtype families a roofline has a peak for.
FLOAT_FAMILY: dict[str, str] = {
    "double": "fp64", "float": "fp32", "c10::Half": "fp16", "c10::BFloat16": "bf16",
    "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8",
    "c10::Float8_e5m2fnuz": "fp8",
}

MATMUL = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::mv",
                    "aten::addmv", "aten::dot", "aten::_scaled_mm"})
CONV = frozenset({"aten::convolution", "aten::_convolution", "aten::cudnn_convolution",
                  "aten::mkldnn_convolution", "aten::miopen_convolution",
                  "aten::thnn_conv2d", "aten::_slow_conv2d_forward", "aten::slow_conv3d"})
CONV_BACKWARD = frozenset({"aten::convolution_backward", "aten::cudnn_convolution_backward",
                           "aten::mkldnn_convolution_backward"})
ELEMENTWISE = frozenset({
    "aten::add", "aten::add_", "aten::sub", "aten::sub_", "aten::mul", "aten::mul_",
    "aten::div", "aten::div_", "aten::relu", "aten::relu_", "aten::gelu", "aten::silu",
    "aten::silu_", "aten::sigmoid", "aten::tanh", "aten::exp", "aten::log", "aten::sqrt",
    "aten::rsqrt", "aten::pow", "aten::neg", "aten::abs", "aten::clamp", "aten::clamp_",
    "aten::clamp_min", "aten::clamp_min_",
    "aten::threshold_backward", "aten::gelu_backward", "aten::silu_backward",
    "aten::sigmoid_backward", "aten::tanh_backward", "aten::where", "aten::addcmul_",
    "aten::addcdiv_", "aten::lerp_", "aten::maximum", "aten::minimum", "aten::masked_fill",
    "aten::masked_fill_", "aten::dropout", "aten::native_dropout", "aten::hardtanh",
    "aten::leaky_relu", "aten::_foreach_add_", "aten::_foreach_mul_",
})
NORMALISE = frozenset({
    "aten::native_layer_norm", "aten::native_layer_norm_backward", "aten::native_batch_norm",
    "aten::native_batch_norm_backward", "aten::cudnn_batch_norm",
    "aten::cudnn_batch_norm_backward", "aten::_softmax", "aten::_softmax_backward_data",
    "aten::_log_softmax", "aten::_log_softmax_backward_data", "aten::native_group_norm",
    "aten::native_group_norm_backward", "aten::_fused_rms_norm", "aten::sum", "aten::mean",
})
COPY = frozenset({"aten::copy_", "aten::clone", "aten::contiguous", "aten::_to_copy",
                  "aten::cat"})
NORMALISE_FLOPS_PER_ELEMENT = 5  # mean, variance, scale, shift: a handful per element

KIND_MATMUL, KIND_CONV, KIND_ELEMENTWISE, KIND_NORMALISE, KIND_COPY = (
    "matmul", "convolution", "elementwise", "normalisation", "copy")
#: Codes of the kinds and dtype families, for integer columns (doctor.trace.events).
COST_KINDS = (KIND_MATMUL, KIND_CONV, KIND_ELEMENTWISE, KIND_NORMALISE, KIND_COPY)
COST_DTYPES = ("", "fp64", "fp32", "bf16", "fp16", "fp8")


#: Memory formats of a convolution's input, as the strides a trace records show it (codes in
#: an integer column: 0 for not known, or neither).
LAYOUTS = ("", "nchw", "nhwc")
LAYOUT_NCHW, LAYOUT_NHWC = 1, 2


def conv_layout(name: str, input_dims: Any, input_strides: Any) -> int:
    """The memory format of a 2-d convolution's first input (forward: the input; backward: the
    incoming gradient), from ``Input Dims`` and ``Input Strides``: NCHW-contiguous, NHWC
    (``channels_last``), or 0 where the strides say neither or cannot tell (one channel, one
    pixel)."""
    if name not in CONV and name not in CONV_BACKWARD:
        return 0
    dims, strides = _dims(input_dims), _dims(input_strides)
    if not dims or not strides or len(dims[0]) != 4 or len(strides[0]) != 4:
        return 0
    (_, c, h, w), (_, sc, sh, sw) = dims[0], strides[0]
    if c == 1 or h * w == 1:
        return 0  # the same bytes in either format
    nchw = sw == 1 and sh == w and sc == h * w
    nhwc = sc == 1 and sw == c and sh == w * c
    if nchw == nhwc:
        return 0
    return LAYOUT_NCHW if nchw else LAYOUT_NHWC


@dataclass(frozen=True)
class OpCost:
    """One call's cost: operations, bytes moved, its kind and dtype family."""

    kind: str
    flops: float
    bytes: float
    dtype: str  # fp32 | bf16 | fp16 | fp64 | fp8 | "" (not a float type)
    estimated: bool = False  # a shape the formula had to assume (a convolution's output)

    @property
    def intensity(self) -> float:
        """Operations per byte moved (inf for no bytes)."""
        return self.flops / self.bytes if self.bytes > 0 else math.inf


def _dims(value: Any) -> list[list[int]]:
    out = []
    for d in value if isinstance(value, list) else []:
        out.append([int(x) for x in d] if isinstance(d, list) and all(
            isinstance(x, int) for x in d) else [])
    return out


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 1


def _tensor_bytes(dims: list[list[int]], types: list[str]) -> float:
    """Bytes of the tensor inputs (a scalar or a list argument has no dims and counts none)."""
    total = 0.0
    for shape, kind in zip(dims, types, strict=False):
        size = DTYPE_BYTES.get(kind)
        if size is not None and shape:
            total += _numel(shape) * size
    return total


def _family(types: list[str]) -> str:
    return next((FLOAT_FAMILY[t] for t in types if t in FLOAT_FAMILY), "")


def _matmul(name: str, dims: list[list[int]]) -> tuple[float, float] | None:
    """(flops, output elements) of a matrix product, or None if the shapes do not fit."""
    shaped = [d for d in dims if d]
    if name in ("aten::addmm", "aten::baddbmm", "aten::addmv") and len(shaped) >= 3:
        shaped = shaped[1:]  # the bias first
    if name in ("aten::mm", "aten::addmm", "aten::_scaled_mm") and len(shaped) >= 2:
        (m, k), (k2, n) = shaped[0][-2:], shaped[1][-2:]
        return (2.0 * m * k * n, m * n) if k == k2 and len(shaped[0]) == 2 else None
    if name in ("aten::bmm", "aten::baddbmm") and len(shaped) >= 2 and len(shaped[0]) == 3:
        b, m, k = shaped[0]
        n = shaped[1][-1]
        return 2.0 * b * m * k * n, b * m * n
    if name in ("aten::mv", "aten::addmv") and len(shaped) >= 2 and len(shaped[0]) == 2:
        m, k = shaped[0]
        return 2.0 * m * k, m
    if name == "aten::dot" and len(shaped) >= 2:
        return 2.0 * shaped[0][0], 1
    return None


def _conv(dims: list[list[int]], backward: bool) -> tuple[float, float, bool] | None:
    """(flops, output elements, estimated) of a convolution: 2 * N * Cout * out spatial *
    Cin/groups * kernel; backward (grad of input and of weight) twice that, with the output's
    size from the incoming gradient."""
    shaped = [d for d in dims if d]
    if backward:  # (grad_output, input, weight, ...)
        if len(shaped) < 3 or len(shaped[0]) < 3 or len(shaped[2]) < 3:
            return None
        grad, weight = shaped[0], shaped[2]
        per_out = _numel(weight[1:])  # Cin/groups * kernel
        return 2.0 * 2.0 * _numel(grad) * per_out, _numel(shaped[1]), False
    if len(shaped) < 2 or len(shaped[0]) < 3 or len(shaped[1]) != len(shaped[0]):
        return None
    x, weight = shaped[0], shaped[1]
    out = [x[0], weight[0], *x[2:]]  # stride 1, same padding: the output's size is assumed
    return 2.0 * _numel(out) * _numel(weight[1:]), _numel(out), True


def op_cost(name: str, input_dims: Any, input_types: Any) -> OpCost | None:
    """The cost of one call of ``name`` with those inputs (see the module docstring)."""
    dims = _dims(input_dims)
    types = [str(t) for t in input_types] if isinstance(input_types, list) else []
    if not dims:
        return None
    family = _family(types)
    elem = DTYPE_BYTES.get(next((t for t in types if t in FLOAT_FAMILY), ""), 4)
    inputs = _tensor_bytes(dims, types)
    if name in MATMUL:
        found = _matmul(name, dims)
        if found is None:
            return None
        flops, out = found
        return OpCost(KIND_MATMUL, flops, inputs + out * elem, family)
    if name in CONV or name in CONV_BACKWARD:
        conv = _conv(dims, name in CONV_BACKWARD)
        if conv is None:
            return None
        flops, out, estimated = conv
        return OpCost(KIND_CONV, flops, inputs + out * elem, family, estimated)
    largest = max((_numel(d) for d in dims if d), default=0)
    if name in ELEMENTWISE:
        in_place = name.endswith("_")
        return OpCost(KIND_ELEMENTWISE, float(largest),
                      inputs + (0 if in_place else largest * elem), family)
    if name in NORMALISE:
        return OpCost(KIND_NORMALISE, float(NORMALISE_FLOPS_PER_ELEMENT * largest),
                      inputs + largest * elem, family)
    if name in COPY:
        return OpCost(KIND_COPY, 0.0, 2.0 * inputs if name != "aten::copy_" else inputs,
                      family)
    return None
