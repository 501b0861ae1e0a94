"""Where each op sits against the machine's roofline: compute-, memory- or launch-bound, and how
far from its roof.

The roofs are the machine's own, measured after the job (doctor.probes.peaks: a GEMM's FLOP/s
per dtype, a copy's bytes/s). A trace analysed on its own has no measurement; its GPU's
published figures (``GPU_PEAKS``, dense, by product name in the trace's ``deviceProperties``)
stand in, and say so. An op's roof at its arithmetic intensity I (operations per byte) is
``min(peak FLOP/s, I * peak bytes/s)``; it is compute-bound when I is past the ridge
(peak FLOP/s over peak bytes/s) and memory-bound below it. An op whose calls are too short for
the work to matter (under ``LAUNCH_US`` of device time per kernel on a GPU, of own time per call
on a CPU) is launch-bound: the cost of issuing it is the cost. Model FLOP utilisation (MFU) is
the analysed steps' operations over their time at the peak of the dtype that did most of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

#: Dense peaks of common GPUs, published by their makers: FLOP/s per dtype family ("tf32" is
#: fp32 matrix maths on Tensor Cores) and memory bandwidth (bytes/s). A cross-check and the
#: roofs of a trace without a measurement.
GPU_PEAKS: dict[str, dict[str, Any]] = {
    "V100": {"flops": {"fp32": 15.7e12, "fp16": 125e12}, "bytes_s": 900e9},
    "A100": {"flops": {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12},
             "bytes_s": 2.0e12},
    "H100": {"flops": {"fp32": 67e12, "tf32": 495e12, "bf16": 989e12, "fp16": 989e12,
                       "fp8": 1979e12}, "bytes_s": 3.35e12},
    "H200": {"flops": {"fp32": 67e12, "tf32": 495e12, "bf16": 989e12, "fp16": 989e12,
                       "fp8": 1979e12}, "bytes_s": 4.8e12},
    "L4": {"flops": {"fp32": 30.3e12, "tf32": 60e12, "bf16": 121e12, "fp16": 121e12},
           "bytes_s": 300e9},
    "A10G": {"flops": {"fp32": 31.2e12, "tf32": 35e12, "bf16": 70e12, "fp16": 70e12},
             "bytes_s": 600e9},
    "T4": {"flops": {"fp32": 8.1e12, "fp16": 65e12}, "bytes_s": 320e9},
}
DTYPE_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}
LAUNCH_US = 10.0
BOUND_COMPUTE, BOUND_MEMORY, BOUND_LAUNCH = "compute", "memory", "launch"


@dataclass(frozen=True)
class Roofs:
    """The roofs ops are held against: FLOP/s by dtype family and bytes/s."""

    flops: Mapping[str, float]
    bytes_s: float
    source: str  # "measured on this machine" | "published figures for <product>"
    device: str = "cpu"
    published: Roofs | None = None  # a measured GPU's published figures, the cross-check

    def peak(self, dtype: str) -> float | None:
        return self.flops.get(dtype) or self.flops.get("fp32")

    def cross_check(self) -> str | None:
        """The measured roofs against the published ones, in words (None: nothing to check)."""
        if self.published is None:
            return None
        parts = [f"{d} {self.flops[d] / p:.0%}" for d, p in self.published.flops.items()
                 if self.flops.get(d) and p]
        parts.append(f"bandwidth {self.bytes_s / self.published.bytes_s:.0%}")
        return (f"measured against the {self.published.source}: " + ", ".join(parts))


def measured_roofs(peaks: Mapping[str, Any] | None, device: str) -> Roofs | None:
    """The roofs of ``device`` ("cpu" or "cuda") from doctor.probes.peaks' record."""
    side = (peaks or {}).get(device)
    if not isinstance(side, dict) or not isinstance(side.get("gemm_flops"), dict):
        return None  # (a run.json damaged or written by hand: no roof rather than a wrong one)
    flops = {DTYPE_NAMES.get(str(k), str(k)): v for k, v in side["gemm_flops"].items()
             if _positive(v)}
    copy: Any = side.get("copy_bytes_s")
    if not flops or not _positive(copy):
        return None
    return Roofs({k: float(v) for k, v in flops.items()}, float(copy), "measured on this machine",
                 device)


def _positive(value: Any) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and 0 < value < float("inf"))


def published_roofs(gpu_name: str | None) -> Roofs | None:
    """The roofs of a GPU by its product name ("NVIDIA A100-SXM4-80GB" -> A100)."""
    if not gpu_name:
        return None
    for product in sorted(GPU_PEAKS, key=len, reverse=True):  # "A100" before "A10G"
        if product in gpu_name.upper():
            spec = GPU_PEAKS[product]
            return Roofs(spec["flops"], spec["bytes_s"], f"published figures for {product}",
                         "cuda")
    return None


def classify(ops: pd.DataFrame, roofs: Roofs, gpu: bool) -> pd.DataFrame:
    """The ops table with ``time_s`` (device time on a GPU, own host time on a CPU), achieved
    FLOP/s and bytes/s, intensity, ``bound`` and ``of_roof`` (achieved over the roof at the
    op's intensity) for each op with a cost; ``bound`` "launch" for ops whose calls are tiny."""
    out = ops.copy()
    out["time_s"] = out["device_s"] if gpu else out["self_s"]
    calls = out["calls"].clip(lower=1)
    if gpu:  # device time per kernel where it launched some
        per_call_us = np.where(out["kernels"] > 0, out["device_s"] / out["kernels"].clip(lower=1),
                               out["time_s"] / calls) * 1e6
    else:
        per_call_us = (out["time_s"] / calls).to_numpy(float) * 1e6
    time_s = out["time_s"].where(out["time_s"] > 0)
    out["achieved_flops"] = out["flops"] / time_s
    out["achieved_bytes_s"] = out["bytes"] / time_s
    out["intensity"] = out["flops"] / out["bytes"].where(out["bytes"] > 0)
    out["roof_dtype"] = [_roof_dtype(roofs, d, k, f, gpu) for d, k, f in
                         zip(out["dtype"], out["kind"], out["achieved_flops"], strict=True)]
    peaks = np.array([roofs.peak(d) or np.nan for d in out["roof_dtype"]], dtype=float)
    intensity = out["intensity"].fillna(0.0).to_numpy(float)
    compute = intensity >= peaks / roofs.bytes_s  # past the ridge
    costed = ((out["costed_calls"] > 0) & time_s.notna()).to_numpy()
    out["bound"] = np.where(~costed, "", np.where(
        per_call_us < LAUNCH_US, BOUND_LAUNCH, np.where(compute, BOUND_COMPUTE, BOUND_MEMORY)))
    with np.errstate(invalid="ignore", divide="ignore"):
        of_roof = np.where(compute, out["achieved_flops"] / peaks,
                           out["achieved_bytes_s"] / roofs.bytes_s)
    out["of_roof"] = np.where(costed, of_roof, np.nan)
    return out


def _roof_dtype(roofs: Roofs, dtype: str, kind: str, achieved: float, gpu: bool) -> str:
    """The roof an op is held to: its dtype's, except fp32 matrix maths on a GPU that went
    faster than fp32 can (TF32 on Tensor Cores: torch's default for convolutions, and for
    matmuls where ``allow_tf32`` is on)."""
    fp32 = roofs.flops.get("fp32")
    if gpu and dtype == "fp32" and kind in ("matmul", "convolution") and "tf32" in roofs.flops \
            and fp32 and achieved > fp32:
        return "tf32"
    return dtype


def mfu(ops: pd.DataFrame, roofs: Roofs, seconds: float) -> tuple[float, str] | None:
    """(model FLOP utilisation, dtype) over ``seconds`` of steps: all costed operations over
    what the peak of the dtype with the most of them does in that time."""
    costed = ops[ops["flops"] > 0]
    if costed.empty or seconds <= 0:
        return None
    column = "roof_dtype" if "roof_dtype" in costed else "dtype"  # TF32 where it ran so
    by_dtype = costed.groupby(column)["flops"].sum()
    dtype = str(by_dtype.idxmax())
    peak = roofs.peak(dtype)
    if not peak:
        return None
    return float(costed["flops"].sum() / (seconds * peak)), dtype
