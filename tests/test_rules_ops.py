"""The op rules (doctor.rules.ops) on ops tables built to be one class each."""

from __future__ import annotations

import pandas as pd
import pytest

from doctor.analyse.ops import RankOps
from doctor.analyse.roofline import Roofs, classify
from doctor.rules import Evidence
from doctor.rules.ops import fp32_gemm, launch_bound, memory_bound

CPU = Roofs({"fp32": 100e9, "bf16": 300e9}, 10e9, "measured on this machine")
GPU = Roofs({"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12}, 2e12, "published figures",
            "cuda")


def evidence(rows: list[dict[str, object]], roofs: Roofs, compute_share: float = 0.8
             ) -> Evidence:
    base = {"kind": "", "dtype": "fp32", "calls": 10, "self_s": 0.0, "device_s": 0.0,
            "kernels": 0, "flops": 0.0, "bytes": 0.0, "costed_calls": 10}
    gpu = roofs.device == "cuda"
    table = classify(pd.DataFrame([{**base, **r} for r in rows]), roofs, gpu)
    table["share"] = table["time_s"] / table["time_s"].sum()
    ledger = pd.DataFrame({"wall_s": [1.0], "compute": [compute_share]})
    return Evidence(ledger=ledger, ops={0: RankOps(0, table, roofs, None, None, 1.0)})


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
    assert memory_bound(evidence([GEMM], CPU)) == []


def test_launch_bound_ops_on_a_gpu() -> None:
    tiny = {"op": "aten::add_", "kind": "elementwise", "calls": 5000, "device_s": 0.02,
            "kernels": 5000, "flops": 5e6, "bytes": 6e7}  # 4 us a kernel
    big = {**GEMM, "device_s": 0.02, "self_s": 0.0, "kernels": 10}
    [f] = launch_bound(evidence([tiny, big], GPU))
    assert f.evidence["calls"] == 5000
    assert "reduce-overhead" in f.fixes[0].code
