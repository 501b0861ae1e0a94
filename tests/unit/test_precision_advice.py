"""Precision advice to a job that autocasts already (issue 35 item 2), on frames built to provoke
it: no autocast fix from compute.bound, ops.fp32_gemm, the memory fixes or gpu.no_tensor_cores
to a job that autocasts on that device, none to the (device, dtype) it has from any rule (the
sound filter); and autocast's casts named with the fix that fits the device."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from doctor.analyse.memory import MemoryEvidence, RankMemory
from doctor.analyse.mixed import RankPrecision
from doctor.analyse.ops import RankOps
from doctor.analyse.precision import Precision, cpu_precision, gpu_precision
from doctor.analyse.roofline import GPU_PEAKS, Roofs, classify
from doctor.rules.compute import compute_bound
from doctor.rules.gpu import no_tensor_cores
from doctor.rules.memory_fit import near_limit
from doctor.rules.ops import fp32_gemm
from doctor.rules.precision import casts
from doctor.rules.sound import sound_findings
from doctor.verdict import Finding, Fix
from tests.support import evidence, steps

GIB = float(1 << 30)
FAST_CPU = cpu_precision(Roofs({"fp32": 100e9, "bf16": 300e9}, 10e9, "m"))
LEDGER = pd.DataFrame({"rank": [0] * 20, "wall_s": [0.1] * 20, "compute": [0.09] * 20,
                       "backward_s": [0.05] * 20, "optimizer_s": [0.01] * 20})


def autocast_codes(findings: list[Finding]) -> list[str]:
    return [x.code for f in findings for x in f.fixes if "torch.autocast" in x.code]


def gemm_ops(roofs: Roofs, gpu: bool, copy_s: float = 0.0) -> RankOps:
    rows = [{"op": "aten::mm", "kind": "matmul", "dtype": "fp32", "calls": 10, "self_s": 0.6,
             "device_s": 0.6 if gpu else 0.0, "kernels": 10, "flops": 8e12, "bytes": 0.3e9,
             "costed_calls": 10, "layout_s": 0.0, "nchw_calls": 0, "nhwc_calls": 0}]
    if copy_s:
        rows.append({**rows[0], "op": "aten::copy_", "kind": "copy", "self_s": copy_s,
                     "device_s": copy_s if gpu else 0.0, "flops": 0.0})
    table = classify(pd.DataFrame(rows), roofs, gpu)
    table["share"] = table["time_s"] / table["time_s"].sum()
    return RankOps(0, table, roofs, None, None, 1.0)


@pytest.mark.parametrize("autocast", [(), (("cpu", "bfloat16"),), (("cpu", "float16"),)])
def test_compute_bound_offers_bf16_only_to_a_job_without_autocast(
        autocast: tuple[tuple[str, str], ...]) -> None:
    [f] = compute_bound(evidence(ledger=LEDGER, device="cpu", precision=FAST_CPU,
                                 autocast=autocast))
    assert bool(autocast_codes([f])) is (not autocast)


@pytest.mark.parametrize("autocast", [(), (("cpu", "bfloat16"),), (("cpu", "float16"),)])
def test_fp32_gemms_on_a_fast_bf16_cpu_get_autocast_only_without_one(
        autocast: tuple[tuple[str, str], ...]) -> None:
    roofs = Roofs({"fp32": 100e9, "bf16": 400e9}, 10e9, "measured", "cpu")
    ev = evidence(ledger=LEDGER, ops={0: gemm_ops(roofs, False)}, device="cpu",
                  precision=FAST_CPU, autocast=autocast)
    [f] = fp32_gemm(ev)  # the GEMMs are still fp32: the finding stays
    assert bool(autocast_codes([f])) is (not autocast)


def memory_rank() -> RankMemory:
    return RankMemory(
        rank=0, node=0, device="cuda",
        parts={"parameters": 2 * GIB, "gradients": 2 * GIB, "optimizer_state": 4 * GIB,
               "activations": 60 * GIB},
        by_dtype={"activations": {"cuda:float32": 60 * GIB}}, optimizers=("AdamW",),
        allocator={}, peak_bytes=76 * GIB, capacity_bytes=80 * GIB, batch_size=32)


@pytest.mark.parametrize("autocast", [(), (("cuda", "float16"),)])
def test_the_memory_fixes_autocast_only_a_job_without_one(
        autocast: tuple[tuple[str, str], ...]) -> None:
    [f] = near_limit(evidence(memory_use=MemoryEvidence({0: memory_rank()}), device="cuda",
                              precision=gpu_precision(9.0), autocast=autocast))
    assert bool(autocast_codes([f])) is (not autocast)


@pytest.mark.parametrize(("cc", "autocast", "dtype"), [
    (8.0, (), "bfloat16"), (7.0, (), "float16"), (9.0, (("cuda", "bfloat16"),), None)])
def test_no_tensor_cores_autocasts_to_the_gpus_fast_type_unless_the_job_does(
        cc: float, autocast: tuple[tuple[str, str], ...], dtype: str | None) -> None:
    [f] = no_tensor_cores(evidence(window=steps(gemm_s=0.06, gemm_tensor_core_s=0.0, gpu_cc=cc),
                                   autocast=autocast))
    codes = autocast_codes([f])
    assert codes == ([] if dtype is None else [codes[0]])
    if dtype is not None:
        assert f"dtype=torch.{dtype}" in codes[0]
        assert ("GradScaler" in codes[0]) is (dtype == "float16")


def test_the_sound_filter_drops_an_autocast_to_what_the_job_has() -> None:
    same = Fix("bf16", "", Precision("bfloat16", "", "cuda").autocast_code())
    other = Fix("fp16", "", Precision("float16", "", "cuda").autocast_code())
    keep = Fix("other", "", "model = model.to(memory_format=torch.channels_last)")
    [f] = sound_findings([Finding("x", "compute", "info", "t", {}, (same, other, keep))], {},
                         autocasts=[("cuda", "bfloat16")])
    assert [x.title for x in f.fixes] == ["fp16", "other"]


def run_casts(device: str, precision: Precision, dtype: str, copy_s: float) -> list[Finding]:
    """precision.casts on a window of fp32 GEMMs (0.6 s) and ``copy_s`` of casts, the job
    autocasting to ``dtype`` on ``device`` whose fast type is ``precision``'s (Evidence's
    ``precision`` and JobFacts' share a name: the job's is set apart)."""
    roofs = Roofs({"fp32": 100e9}, 10e9, "measured", "cpu") if device == "cpu" else \
        Roofs(GPU_PEAKS["A100"]["flops"], GPU_PEAKS["A100"]["bytes_s"], "A100", "cuda")
    share = copy_s / (0.6 + copy_s)
    mixed = RankPrecision(0, ((device, dtype),), None, 0, 0, 0, None, share, copy_s)
    ev = evidence(ledger=LEDGER, ops={0: gemm_ops(roofs, device == "cuda", copy_s)},
                  device=device, autocast=((device, dtype),))
    return casts(replace(ev, precision={0: mixed}, job=replace(ev.job, precision=precision)))


def test_casts_on_a_cpu_that_runs_no_16_bit_type_fast_say_leave_autocast_off() -> None:
    [f] = run_casts("cpu", cpu_precision(None), "float16", copy_s=0.4)
    assert f.evidence["cast_share_of_ops"] == pytest.approx(0.4)
    assert f.severity == "warning" and "40%" in f.title
    assert f.fixes[0].title == "Leave autocast off" and "enabled=False" in f.fixes[0].code
    assert f.estimated_speedup is not None and f.estimated_speedup > 1.2


def test_fp16_casts_on_an_ampere_gpu_get_bf16_without_the_scaler() -> None:
    [f] = run_casts("cuda", gpu_precision(8.0), "float16", copy_s=0.2)
    assert f.fixes[0].title == "Autocast to bfloat16 instead"
    assert "GradScaler" not in f.fixes[0].code


def test_bf16_casts_on_a_gpu_that_runs_bf16_fast_are_the_price_fused_by_compile() -> None:
    [f] = run_casts("cuda", gpu_precision(9.0), "bfloat16", copy_s=0.2)
    assert [x.title for x in f.fixes] == ["Fuse the casts: torch.compile"]


def test_a_few_casts_are_no_finding() -> None:
    assert run_casts("cpu", cpu_precision(None), "float16", copy_s=0.03) == []
