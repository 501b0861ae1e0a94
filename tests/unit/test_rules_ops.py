"""The op rules (doctor.rules.ops) on ops tables built to be one class each."""

from __future__ import annotations

import pandas as pd
import pytest

from doctor.analyse.ops import RankOps
from doctor.analyse.roofline import Roofs, classify
from doctor.rules import Evidence
from doctor.rules.ops import channels_last, fp32_gemm, launch_bound, memory_bound
from tests.support import SHARED_TRACES

CPU = Roofs({"fp32": 100e9, "bf16": 300e9}, 10e9, "measured on this machine")
GPU = Roofs({"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12}, 2e12, "published figures",
            "cuda")


def evidence(rows: list[dict[str, object]], roofs: Roofs, compute_share: float = 0.8,
             gpu_busy: float | None = None, window_s: float = 1.0) -> Evidence:
    base = {"kind": "", "dtype": "fp32", "calls": 10, "self_s": 0.0, "device_s": 0.0,
            "kernels": 0, "flops": 0.0, "bytes": 0.0, "costed_calls": 10, "layout_s": 0.0,
            "nchw_calls": 0, "nhwc_calls": 0}
    gpu = roofs.device == "cuda"
    table = classify(pd.DataFrame([{**base, **r} for r in rows]), roofs, gpu)
    table["share"] = table["time_s"] / table["time_s"].sum()
    opt = table["opt_device_s" if gpu else "opt_self_s"] if "opt_self_s" in table else 0.0
    table["opt_share"] = opt / table["time_s"].sum()
    ledger = pd.DataFrame({"wall_s": [1.0], "compute": [compute_share]})
    window = None if gpu_busy is None else pd.DataFrame(
        {"device": ["cuda"] * 2, "dur_s": [window_s / 2] * 2,
         "gpu_busy_s": [gpu_busy * window_s / 2] * 2})
    return Evidence(ledger=ledger, window=window,
                    ops={0: RankOps(0, table, roofs, None, None, window_s)})


GEMM = {"op": "aten::mm", "kind": "matmul", "self_s": 0.6, "flops": 30e9, "bytes": 0.3e9}
ADD = {"op": "aten::add", "kind": "elementwise", "self_s": 0.3, "flops": 0.1e9,
       "bytes": 1.2e9}


def test_fp32_gemms_on_a_machine_with_a_faster_half_roof() -> None:
    [f] = fp32_gemm(evidence([GEMM, ADD], CPU))
    assert f.evidence["gemm_flops_share"] == pytest.approx(30 / 30.1)
    # the GEMMs' 2/3 of the ops, at a third of the time in bf16, out of 80 % compute
    assert f.estimated_speedup == pytest.approx(1 / (1 - 0.8 * (0.6 / 0.9) * (1 - 1 / 3)))
    assert fp32_gemm(evidence([GEMM, ADD], Roofs({"fp32": 100e9}, 10e9, "x"))) == []


def test_memory_bound_elementwise_ops_are_for_fusion() -> None:
    [f] = memory_bound(evidence([GEMM, ADD], CPU))
    assert f.evidence["share_of_ops"] == pytest.approx(1 / 3)
    assert "torch.compile" in f.fixes[0].code
    assert f.fixes[0].why.endswith("of the ops' time goes away.")  # a sentence that ends
    assert memory_bound(evidence([GEMM], CPU)) == []


def test_launch_bound_ops_on_a_gpu() -> None:
    tiny = {"op": "aten::add_", "kind": "elementwise", "calls": 5000, "device_s": 0.02,
            "kernels": 5000, "flops": 5e6, "bytes": 6e7}  # 4 us a kernel
    big = {**GEMM, "device_s": 0.02, "self_s": 0.0, "kernels": 10}
    [f] = launch_bound(evidence([tiny, big], GPU))
    assert f.evidence["calls"] == 5000
    assert "reduce-overhead" in f.fixes[0].code


def test_an_unfused_optimizers_ops_are_not_for_torch_compile() -> None:
    """Adam's elementwise ops inside its step (opt_self_s) are the optimizer's cost, which
    foreach/fused fixes: the fusing and launch findings leave them out and do not name them."""
    adam = [{"op": f"aten::{name}", "kind": "elementwise", "self_s": 0.1, "flops": 0.02e9,
             "bytes": 0.4e9, "opt_self_s": 0.1} for name in ("mul_", "sqrt", "lerp_")]
    model_add = {**ADD, "self_s": 0.2, "opt_self_s": 0.0}
    gemm = {**GEMM, "opt_self_s": 0.0}
    assert memory_bound(evidence([gemm, *adam], CPU)) == []  # all of it the optimizer's
    [f] = memory_bound(evidence([gemm, model_add, *adam], CPU))
    assert f.evidence["ops"] == ["aten::add"]
    assert f.evidence["share_of_ops"] == pytest.approx(0.2 / 1.1)
    assert f.evidence["optimizer_share_left_out"] == pytest.approx(0.3 / 1.1)
    tiny = [{"op": f"aten::{name}", "kind": "elementwise", "calls": 5000, "self_s": 0.02,
             "flops": 5e6, "bytes": 6e7, "opt_self_s": 0.02} for name in ("add_", "mul_")]
    assert launch_bound(evidence([{**GEMM, "self_s": 0.01, "opt_self_s": 0.0}, *tiny], CPU)) \
        == []


CONV = {"op": "aten::cudnn_convolution", "kind": "convolution", "dtype": "fp16",
        "device_s": 0.5, "kernels": 100, "flops": 400e12 * 0.5 * 0.3, "bytes": 1e9}


def test_transposes_around_convolutions_are_for_channels_last_and_the_busier_gpu_gains_more(
        ) -> None:
    conv = {**CONV, "layout_s": 0.1}  # a fifth of the convolution's device time transposes
    [busy] = channels_last(evidence([conv, {**ADD, "device_s": 0.5, "kernels": 100}], GPU,
                                    gpu_busy=1.0))
    assert busy.evidence["share_of_ops"] == pytest.approx(0.1)
    assert "channels_last" in busy.fixes[0].code
    # the whole window on the GPU: its 0.1 s of 1 s go
    assert busy.estimated_speedup == pytest.approx(1 / 0.9)
    assert busy.severity == "warning"
    [idle] = channels_last(evidence([conv, {**ADD, "device_s": 0.5, "kernels": 100}], GPU,
                                    gpu_busy=0.3))
    assert idle.estimated_speedup == pytest.approx(1 / (1 - 0.1 * 0.3))
    assert idle.severity == "info"  # a GPU waiting for its host gains little


def test_nchw_convolutions_by_their_strides_are_a_suggestion_without_an_estimate() -> None:
    nchw = {**CONV, "nchw_calls": 100}
    [f] = channels_last(evidence([nchw, {**ADD, "device_s": 0.2}], GPU, gpu_busy=1.0))
    assert f.estimated_speedup is None and f.severity == "info"
    assert f.evidence["nchw_calls"] == 100
    nhwc = {**CONV, "nhwc_calls": 100}
    assert channels_last(evidence([nhwc, {**ADD, "device_s": 0.2}], GPU, gpu_busy=1.0)) == []
    v100 = Roofs({"fp32": 15.7e12, "fp16": 125e12}, 900e9, "published figures", "cuda")
    fp32 = {**nchw, "dtype": "fp32", "flops": 1e12}
    assert channels_last(evidence([fp32], v100, gpu_busy=1.0)) == []  # no TF32 on a V100
    assert channels_last(evidence([{**nchw, "self_s": 0.5, "device_s": 0.0}], CPU)) == []


def test_the_a100_resnet_trace_transposes_around_its_convolutions() -> None:
    from doctor.pipeline import analyze_traces

    path = SHARED_TRACES / "ddp_a100_rank0_of_2_hostbound.json.gz"
    if not path.is_file():
        pytest.skip(f"{path} is not here (../shared/traces)")
    found = {f.id: f for f in analyze_traces([path]).verdict.findings}
    f = found["ops.channels_last"]
    # nchwToNhwc and nhwcToNchw kernels: ~9 % of the op time; the GPU idles most of the step
    # waiting for the host, so the gain is small
    assert 0.06 < f.evidence["share_of_ops"] < 0.12
    assert "aten::convolution_backward" in f.evidence["ops"]
    assert f.estimated_speedup is not None and 1.0 < f.estimated_speedup < 1.05
