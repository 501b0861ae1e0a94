"""Which 16-bit type the job's device runs fast, for every precision fix (compute and memory).

On a GPU, by its compute capability (the trace's ``deviceProperties``, else its product name
as NVML or the trace names it): bf16 from 8.0 (Ampere) on; fp16 with a GradScaler on Volta and
Turing (7.x: fp16 Tensor Cores, no bf16 path); none before (no Tensor Cores). A GPU of unknown
generation gets bf16, saying what to use on Volta and Turing instead. On a CPU, bf16 only where
this machine's own measured bf16 GEMM roof (doctor.probes.peaks) beats its fp32 one by
FASTER_BY (AVX-512 BF16, AMX); without that measurement, none: a CPU without those units runs
bf16 slower than fp32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from doctor.analyse.roofline import Roofs, measured_roofs
from doctor.store.rundata import RunData

FASTER_BY = 1.2  # a 16-bit GEMM roof at least this many times the fp32 one is worth autocast
#: Compute capability by product name (the longest name that matches first).
CAPABILITY = {"P100": 6.0, "V100": 7.0, "T4": 7.5, "RTX 20": 7.5, "A100": 8.0, "A10G": 8.6,
              "A10": 8.6, "A30": 8.0, "A40": 8.6, "RTX 30": 8.6, "L4": 8.9, "L40": 8.9,
              "RTX 40": 8.9, "H100": 9.0, "H200": 9.0, "GH200": 9.0, "B200": 10.0}

BF16, FP16 = "bfloat16", "float16"


@dataclass(frozen=True)
class Precision:
    """The 16-bit type to autocast to on the job's device (None: none runs faster there), and
    why, in words."""

    dtype: str | None
    why: str
    device: str = "cpu"

    @property
    def scaler(self) -> bool:
        """Whether the type needs a GradScaler (fp16: its range is too small for gradients)."""
        return self.dtype == FP16

    @property
    def short(self) -> str:
        return {BF16: "bf16", FP16: "fp16"}.get(self.dtype or "", "")

    def autocast_code(self, forward: str = "loss = loss_fn(model(x), y)") -> str:
        """The lines that run ``forward`` under autocast, with the scaler fp16 needs."""
        head = f"with torch.autocast(\"{self.device}\", dtype=torch.{self.dtype}):\n    {forward}"
        if not self.scaler:
            return head + "\nloss.backward()"
        return (f"scaler = torch.amp.GradScaler(\"{self.device}\")\n{head}\n"
                "scaler.scale(loss).backward()\nscaler.step(optimizer)\nscaler.update()")


def capability_of(name: str | None) -> float | None:
    """A GPU's compute capability by its product name (None: not a name known here)."""
    upper = (name or "").upper()
    for product in sorted(CAPABILITY, key=len, reverse=True):
        if product in upper:
            return CAPABILITY[product]
    return None


def job_precision(run: RunData, device: str, window: pd.DataFrame) -> Precision:
    """The 16-bit type of the module docstring for this run's device."""
    if device == "cuda":
        return gpu_precision(_capability(run, window))
    return cpu_precision(measured_roofs(
        run.record.peaks if isinstance(run.record.peaks, dict) else None, "cpu"))


def cpu_precision(roofs: Roofs | None) -> Precision:
    """bf16 on a CPU whose measured roofs (``roofs``) show it faster than fp32."""
    fp32, bf16 = (roofs.flops.get("fp32"), roofs.flops.get("bf16")) if roofs else (None, None)
    if not fp32 or not bf16:
        return Precision(None, "this CPU's bf16 speed was not measured (a CPU without AVX-512 "
                               "BF16 or AMX runs bf16 slower than fp32)")
    if bf16 < FASTER_BY * fp32:
        return Precision(None, f"this CPU's measured bf16 GEMM roof is {bf16 / fp32:.2g}x its "
                               "fp32 one: no faster")
    return Precision(BF16, f"this CPU's measured bf16 GEMM roof is {bf16 / fp32:.2g}x its fp32 "
                           "one")


def gpu_precision(capability: float | None) -> Precision:
    """The 16-bit type of a GPU of ``capability`` (None: unknown)."""
    if capability is None:
        return Precision(BF16, "on a GPU of compute capability 8.0 or newer; on V100 or T4 use "
                               "float16 with a GradScaler", "cuda")
    if capability >= 8.0:
        return Precision(BF16, f"compute capability {capability:.1f}: bf16 Tensor Cores",
                         "cuda")
    if capability >= 7.0:
        return Precision(FP16, f"compute capability {capability:.1f}: fp16 Tensor Cores and no "
                               "bf16 path, so fp16 with a GradScaler", "cuda")
    return Precision(None, f"compute capability {capability:.1f}: no Tensor Cores", "cuda")


def _capability(run: RunData, window: pd.DataFrame) -> float | None:
    """The GPU's compute capability: the window's deviceProperties, else its product name."""
    if "gpu_cc" in window:
        known = window["gpu_cc"].dropna()
        if len(known) and not math.isnan(float(known.iloc[0])) and float(known.iloc[0]) > 0:
            return float(known.iloc[0])
    names: list[Any] = [g.get("name") for g in run.record.gpus]
    if "gpu_name" in window:
        names += list(window["gpu_name"].dropna())
    found = [c for c in (capability_of(str(n)) for n in names if n) if c is not None]
    return min(found) if found else None
