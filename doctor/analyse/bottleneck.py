"""The bottleneck: which category it is (one policy, every door), and the summary of the shares.

Compute is the work itself; input, transfer and communication are stalls that a well-built job
hides. So the verdict is stall-first, with thresholds from the field's own tools (XProf calls a
step highly input-bound at 20 % input, collective-bound at 30 %; TraceML warns at 10 % and
calls 20 % critical):

1. The input pipeline is one stall: io + decode + preprocess (+ input wait that could not be
   split). It qualifies at STALL_SHARE of the analysed step time; so does transfer.
   Communication qualifies at COMM_SHARE, or from STALL_SHARE when it is at least the device's
   own compute time (GPU kernels on a GPU job, compute on a CPU job): a stall below STALL_SHARE
   never qualifies.
2. If any stall qualifies, the largest qualifying stall is the bottleneck; the input pipeline is
   named by its largest stage (``preprocess`` for io 18 % + preprocess 34 %), and
   ``bottleneck_share`` is the pipeline's whole share.
3. Otherwise the largest category other than ``other`` (normally compute); ``unknown`` when no
   category has any time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from doctor.analyse.step_table import analysed
from doctor.categories import CATEGORIES, INPUT_PIPELINE, UNSPLIT_INPUT
from doctor.verdict import Finding, Fix

STALL_SHARE = 0.20
COMM_SHARE = 0.30
FEW_STEPS = 20

__all__ = ["COMM_SHARE", "STALL_SHARE", "Summary", "choose_bottleneck", "no_steps_finding",
           "summarise"]


def choose_bottleneck(shares: Mapping[str, float], device_compute_share: float
                      ) -> tuple[str, float]:
    """(the bottleneck, its share: the whole input pipeline's when an input stage is named)
    for ``shares`` of the analysed step time (policy in the module docstring)."""
    stalls: dict[str, float] = {}
    pipeline = {c: shares.get(c, 0.0) for c in INPUT_PIPELINE}
    if sum(pipeline.values()) >= STALL_SHARE:
        stalls[max(pipeline, key=lambda c: pipeline[c])] = sum(pipeline.values())
    transfer = shares.get("transfer", 0.0)
    if transfer >= STALL_SHARE:
        stalls["transfer"] = transfer
    comm = shares.get("communication", 0.0)
    if comm >= COMM_SHARE or (comm >= STALL_SHARE and comm >= device_compute_share):
        stalls["communication"] = comm
    if stalls:
        worst = max(stalls, key=lambda c: stalls[c])
        return worst, stalls[worst]
    ranked = {c: v for c, v in shares.items() if c != "other"}
    if not ranked or max(ranked.values()) <= 0:
        return "unknown", 0.0
    best = max(ranked, key=lambda c: ranked[c])
    return best, ranked[best]


@dataclass(frozen=True)
class Summary:
    steps: dict[str, Any]
    shares: dict[str, float]
    bottleneck: str
    bottleneck_share: float
    notes: list[str]

    @property
    def no_steps(self) -> bool:
        """No analysed step had any time: nothing to split (not a run of all 'other')."""
        return not any(self.shares.values())


def summarise(ledger: pd.DataFrame) -> Summary:
    """Shares over the analysed steps, the bottleneck, and notes on which steps count."""
    count = len(ledger)
    steady = analysed(ledger)
    notes = _step_notes(ledger, steady)
    steps: dict[str, Any] = {
        "count": count, "analyzed": len(steady),
        "median_s": float(steady["wall_s"].median()) if len(steady) else None}
    if "micro_batches" in steady and steady["micro_batches"].notna().any():
        # backward() calls per step: more than one is gradient accumulation
        steps["micro_batches"] = float(steady["micro_batches"].median())
    if "skipped" in ledger and ledger["skipped"].any():  # a GradScaler's, all steps
        steps["skipped"] = int(ledger["skipped"].sum())
    if count and not ledger["in_range"].all():
        inside = ledger.loc[ledger["in_range"], "step"]
        steps["range"] = [int(inside.min()), int(inside.max())]
    total = float(steady["wall_s"].sum()) if len(steady) else 0.0
    if total <= 0:
        return Summary(steps, dict.fromkeys(CATEGORIES, 0.0), "unknown", 0.0, notes)
    shares = {c: float(steady[c].sum()) / total for c in CATEGORIES}
    unsplit = float(steady[UNSPLIT_INPUT].sum()) / total
    if unsplit > 0:
        shares[UNSPLIT_INPUT] = unsplit
    device = float(steady["device_compute_s"].sum()) / total
    bottleneck, share = choose_bottleneck(shares, device)
    if len(steady) < FEW_STEPS:
        notes.append(f"Only {len(steady)} steps were analysed (about {FEW_STEPS} steady steps "
                     "make a firm verdict): run the job longer for a firmer verdict.")
    return Summary(steps, shares, bottleneck, share, notes)


def _step_notes(ledger: pd.DataFrame, steady: pd.DataFrame) -> list[str]:
    """Which steps are left out of the shares, and why."""
    if ledger.empty:
        return []
    notes = []
    if not ledger["analyzed"].any():
        notes.append(f"Only {len(steady)} steps were seen: too few to leave warm-up out, so "
                     "every step counts.")
    warm = int(ledger["warmup"].sum())
    if warm:
        notes.append(f"The first {warm} step(s) per rank are warm-up (lazy imports, "
                     "allocator growth, compilation) and are left out of the shares.")
    inside = int((ledger["in_window"] & ledger["in_range"]).sum())
    if inside:
        notes.append(f"The {inside} steps of the torch.profiler window carry doctor's own "
                     "profiling cost (the trace export most of all) and are left out of the "
                     "shares.")
    left = (ledger["sampled"] & ledger["in_range"] & ~ledger["analyzed"] & ~ledger["warmup"]
            & ~ledger["in_window"])
    if left.any():
        notes.append(f"The {int(left.sum())} steps during stack sampling (py-spy pauses the "
                     "processes) are left out of the shares; the input split comes from them.")
    if "compiling" in ledger:
        compiling = ledger["compiling"] & ledger["in_range"] & ~ledger["analyzed"]
        if compiling.any():
            notes.append(f"The {int(compiling.sum())} steps in which torch.compile compiled are "
                         "left out of the shares: their compile time is said apart.")
    return notes


def no_steps_finding(why: str, trace: bool, fix: Fix | None = None) -> Finding:
    """The finding of an ``unknown`` verdict: nothing to split, why, and how to give steps
    (``fix``, where marking them is not it: Python's options that kept doctor out, too few
    steps)."""
    fixes = (fix,) if fix is not None else (Fix(
        title="Record a few steps with prof.step()",
        why="doctor reads one step per ProfilerStep#N; call prof.step() once per training step "
            "inside the profiler",
        code="with torch.profiler.profile(schedule=torch.profiler.schedule("
             "wait=1, warmup=1, active=5)) as prof:\n    for batch in loader:\n"
             "        train_step(batch)\n        prof.step()",
    ) if trace else Fix(
        title="Mark each step with doctor.step()",
        why=f"doctor finds steps from torch.optim, backward() and DataLoader; here {why}.",
        code="import doctor\n\nfor batch in batches:\n    train_step(batch)\n    doctor.step()",
    ),)
    return Finding(
        id="steps.none", category="other", severity="warning",
        title=f"No training steps were seen, so there is nothing to split into categories: "
              f"{why}",
        evidence={"reason": why}, fixes=fixes)
