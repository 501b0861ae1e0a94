"""Ops against the roofline (doctor.analyse.roofline): compute-, memory- and launch-bound on
ops built to be each, fp32 GEMMs that ran on Tensor Cores held to TF32, MFU, and a real
trace's GEMMs and elementwise ops in their classes."""

from __future__ import annotations

import pandas as pd
import pytest

from doctor.analyse.roofline import (
    BOUND_COMPUTE,
    BOUND_LAUNCH,
    BOUND_MEMORY,
    Roofs,
    classify,
    measured_roofs,
    mfu,
    published_roofs,
)
from tests.support import SHARED_TRACES

CPU = Roofs({"fp32": 100e9, "bf16": 300e9}, 10e9, "measured on this machine")


def ops(*rows: dict[str, object]) -> pd.DataFrame:
    base = {"kind": "", "dtype": "fp32", "calls": 10, "self_s": 0.0, "device_s": 0.0,
            "kernels": 0, "flops": 0.0, "bytes": 0.0, "costed_calls": 10}
    return pd.DataFrame([{**base, **r} for r in rows])


def test_each_class_on_ops_built_to_be_it() -> None:
    table = classify(ops(
        # 1024^3 GEMM x10: intensity ~170 FLOP/byte, past the CPU's ridge of 10
        {"op": "aten::mm", "kind": "matmul", "self_s": 0.4, "flops": 10 * 2 * 1024**3,
         "bytes": 10 * 3 * 4 * 1024**2},
        {"op": "aten::add", "kind": "elementwise", "self_s": 0.05, "flops": 10 * 1024**2,
         "bytes": 10 * 12 * 1024**2},
        {"op": "aten::mul", "kind": "elementwise", "self_s": 50e-6, "calls": 10,
         "flops": 10 * 64, "bytes": 10 * 768},  # 5 us a call
    ), CPU, gpu=False).set_index("op")
    assert table.loc["aten::mm", "bound"] == BOUND_COMPUTE
    assert table.loc["aten::mm", "of_roof"] == pytest.approx(10 * 2 * 1024**3 / 0.4 / 100e9)
    assert table.loc["aten::add", "bound"] == BOUND_MEMORY
    assert table.loc["aten::add", "of_roof"] == pytest.approx(10 * 12 * 1024**2 / 0.05 / 10e9)
    assert table.loc["aten::mul", "bound"] == BOUND_LAUNCH


def test_fp32_gemms_faster_than_fp32_can_are_held_to_tf32() -> None:
    a100 = published_roofs("NVIDIA A100-SXM4-80GB")
    assert a100 is not None and "A100" in a100.source
    fast = ops({"op": "aten::mm", "kind": "matmul", "device_s": 1.0, "kernels": 10,
                "flops": 60e12, "bytes": 1e9})
    [row] = classify(fast, a100, gpu=True).itertuples()
    assert row.roof_dtype == "tf32" and row.of_roof == pytest.approx(60e12 / 156e12)
    assert published_roofs("NVIDIA A10G")is not None
    assert published_roofs("NVIDIA A10G").source.endswith("A10G")  # type: ignore[union-attr]
    assert published_roofs("Some Other Accelerator") is None


def test_mfu_and_the_measured_roofs() -> None:
    roofs = measured_roofs({"cpu": {"gemm_flops": {"float32": 100e9}, "copy_bytes_s": 1e10}},
                           "cpu")
    assert roofs is not None and roofs.flops == {"fp32": 100e9}
    table = ops({"op": "aten::mm", "flops": 50e9}, {"op": "aten::add", "flops": 1e9})
    value, dtype = mfu(table, roofs, seconds=1.0)  # type: ignore[misc]
    assert dtype == "fp32" and value == pytest.approx(0.51)
    assert measured_roofs(None, "cuda") is None


@pytest.mark.skipif(not SHARED_TRACES.is_dir(),
                    reason=f"the recorded traces are not here ({SHARED_TRACES})")
def test_a_real_traces_gemms_and_elementwise_ops() -> None:
    from doctor.trace.events import load_timeline
    from doctor.trace.ops import op_table

    def table_of(name: str) -> pd.DataFrame:
        t = load_timeline(SHARED_TRACES / name)
        roofs = published_roofs(t.meta.device_properties[0]["name"])
        assert roofs is not None
        return classify(op_table(t), roofs, gpu=True).set_index("op")

    a100 = table_of("a100_rank0_of_16_pageable.json.gz")
    # 11.5 TFLOP/s at 30 FLOP/byte: fp32's roof, past its ridge (19.5e12 / 2e12 = 9.75)
    assert a100.loc["aten::mm", "roof_dtype"] == "fp32"
    assert a100.loc["aten::mm", "bound"] == BOUND_COMPUTE
    recsys = table_of("recsys_a100_rank3_of_8.json.gz")
    # 30 TFLOP/s in fp32 is past what fp32 can: Tensor Cores (TF32), whose ridge (78) is
    # beyond these GEMMs' 72 FLOP/byte
    assert recsys.loc["aten::mm", "roof_dtype"] == "tf32"
    assert recsys.loc["aten::mm", "bound"] == BOUND_MEMORY
    assert recsys.loc["aten::add", "bound"] == BOUND_MEMORY
    assert 0.2 < recsys.loc["aten::add", "of_roof"] < 1.0


@pytest.mark.skipif(not SHARED_TRACES.is_dir(),
                    reason=f"the recorded traces are not here ({SHARED_TRACES})")
def test_the_trace_door_gives_the_ops_and_mfu() -> None:
    from doctor.pipeline import analyze_traces
    from doctor.reports.json import verdict_data

    analysis = analyze_traces([SHARED_TRACES / "recsys_a100_rank3_of_8.json.gz"])
    [ops] = verdict_data(analysis)["ops"]
    assert ops["rank"] == 3 and "A100" in ops["roofs"]["source"]
    # most of its operations ran as TF32: MFU against TF32's peak, a few percent
    assert ops["mfu_dtype"] == "tf32" and 0.01 < ops["mfu"] < 0.1
    top = analysis.tables.ops
    assert top is not None
    assert len(top) == 15 and top["share"].is_monotonic_decreasing
    assert set(top.loc[top["op"].isin(["aten::mm", "aten::addmm"]), "kind"]) == {"matmul"}


def test_a_measured_gpu_is_checked_against_its_published_figures() -> None:
    from dataclasses import replace

    from doctor.analyse.roofline import measured_roofs, published_roofs
    from doctor.reports.json import roofs_data

    peaks = {"cuda": {"gemm_flops": {"float32": 18e12, "tf32": 120e12, "bfloat16": 250e12},
                      "copy_bytes_s": 1.6e12}}
    measured = measured_roofs(peaks, "cuda")
    assert measured is not None and measured.flops["tf32"] == 120e12
    checked = replace(measured, published=published_roofs("NVIDIA A100-SXM4-80GB"))
    words = roofs_data(checked)["cross_check"]
    assert "A100" in words and "bf16 80%" in words and "bandwidth 80%" in words
    assert "cross_check" not in roofs_data(measured)
