"""Precision advice by what the device runs fast (doctor.analyse.precision): bf16 from compute
capability 8.0, fp16 with a GradScaler on Volta and Turing, on a CPU bf16 only with its own
measured roof; and every precision fix (compute, memory, ops) follows it."""

from __future__ import annotations

import pandas as pd
import pytest

from doctor.analyse.memory import MemoryEvidence, RankMemory
from doctor.analyse.ops import RankOps
from doctor.analyse.precision import capability_of, cpu_precision, gpu_precision
from doctor.analyse.roofline import GPU_PEAKS, Roofs, classify
from doctor.rules.compute import compute_bound
from doctor.rules.memory_fit import near_limit
from doctor.rules.ops import fp32_gemm
from tests.support import evidence

GIB = float(1 << 30)


@pytest.mark.parametrize(("name", "cc"), [
    ("Tesla V100-SXM2-16GB", 7.0), ("Tesla T4", 7.5), ("NVIDIA A100-SXM4-80GB", 8.0),
    ("NVIDIA A10G", 8.6), ("NVIDIA H100 80GB HBM3", 9.0), ("NVIDIA L4", 8.9),
    ("Some Future GPU", None)])
def test_capability_by_product_name(name: str, cc: float | None) -> None:
    assert capability_of(name) == cc


def test_a_gpu_gets_the_16_bit_type_it_runs_fast() -> None:
    assert gpu_precision(8.0).dtype == "bfloat16" and not gpu_precision(9.0).scaler
    v100 = gpu_precision(7.0)
    assert v100.dtype == "float16" and v100.scaler
    assert "GradScaler" in v100.autocast_code() and "scaler.step(optimizer)" in \
        v100.autocast_code()
    assert gpu_precision(6.0).dtype is None  # no Tensor Cores
    unknown = gpu_precision(None)
    assert unknown.dtype == "bfloat16" and "V100" in unknown.why


def test_a_cpu_gets_bf16_only_with_its_own_measured_roof() -> None:
    assert cpu_precision(None).dtype is None
    assert cpu_precision(Roofs({"fp32": 100e9, "bf16": 90e9}, 10e9, "m")).dtype is None
    fast = cpu_precision(Roofs({"fp32": 100e9, "bf16": 300e9}, 10e9, "m"))
    assert fast.dtype == "bfloat16" and "3x" in fast.why


def rank(device: str) -> RankMemory:
    return RankMemory(
        rank=0, node=0, device=device,
        parts={"parameters": 2 * GIB, "gradients": 2 * GIB, "optimizer_state": 4 * GIB,
               "activations": 60 * GIB},
        by_dtype={"activations": {f"{device}:float32": 60 * GIB}},
        optimizers=("AdamW",), allocator={}, peak_bytes=76 * GIB, capacity_bytes=80 * GIB,
        batch_size=32)


def autocast_titles(device: str, **job: object) -> list[str]:
    [f] = near_limit(evidence(memory_use=MemoryEvidence({0: rank(device)}), device=device, **job))
    return [x.title for x in f.fixes if "utocast" in x.title]


def test_the_memory_fix_autocasts_to_what_the_device_runs_fast() -> None:
    assert autocast_titles("cuda", precision=gpu_precision(7.0)) == [
        "Autocast the forward pass to float16"]
    assert autocast_titles("cuda", precision=gpu_precision(8.0)) == [
        "Autocast the forward pass to bfloat16"]
    assert autocast_titles("cuda", precision=gpu_precision(6.0)) == []
    assert autocast_titles("cpu") == []  # bf16 not measured faster on this CPU
    fast = cpu_precision(Roofs({"fp32": 100e9, "bf16": 300e9}, 10e9, "m"))
    assert autocast_titles("cpu", precision=fast) == ["Autocast the forward pass to bfloat16"]


def test_compute_bound_offers_cpu_bf16_only_where_it_was_measured_faster() -> None:
    ledger = pd.DataFrame({"rank": [0] * 20, "wall_s": [0.1] * 20, "compute": [0.1] * 20,
                           "backward_s": [0.05] * 20, "optimizer_s": [0.01] * 20})
    [plain] = compute_bound(evidence(ledger=ledger, device="cpu"))
    assert not any("float16" in f.code for f in plain.fixes)
    fast = cpu_precision(Roofs({"fp32": 100e9, "bf16": 300e9}, 10e9, "m"))
    [amx] = compute_bound(evidence(ledger=ledger, device="cpu", precision=fast))
    assert any("torch.bfloat16" in f.code for f in amx.fixes)


def test_fp32_gemms_on_a_v100_are_told_fp16_with_a_scaler() -> None:
    """The V100's published roofs have no bf16 or TF32 path: its 16-bit GEMMs are fp16."""
    spec = GPU_PEAKS["V100"]
    roofs = Roofs(spec["flops"], spec["bytes_s"], "published figures for V100", "cuda")
    row = {"op": "aten::mm", "kind": "matmul", "dtype": "fp32", "calls": 10, "self_s": 0.0,
           "device_s": 0.6, "kernels": 10, "flops": 8e12, "bytes": 0.3e9, "costed_calls": 10,
           "layout_s": 0.0, "nchw_calls": 0, "nhwc_calls": 0}
    table = classify(pd.DataFrame([row]), roofs, True)
    table["share"] = 1.0
    ev = evidence(ledger=pd.DataFrame({"wall_s": [1.0], "compute": [0.8]}),
                  ops={0: RankOps(0, table, roofs, None, None, 1.0)}, device="cuda",
                  precision=gpu_precision(7.0))
    [f] = fp32_gemm(ev)
    assert [x.title for x in f.fixes] == ["Autocast to float16"]
    assert "GradScaler" in f.fixes[0].code
