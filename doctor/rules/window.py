"""What the rules over the profiler window share: its analysed steps, per-step means, and the
speedup and severity of a share of the step.

Figures in evidence are per-step means (seconds) or fractions of the mean step (``*_share``).
``estimated_speedup`` is the mean step time over the step time with the finding's share removed
(or overlapped), as DESIGN.md defines it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from doctor.analyse.evidence import Evidence
from doctor.rules.base import RuleSkipped
from doctor.verdict import Finding, Fix


def window_steps(ev: Evidence, device: str | None = "cuda") -> pd.DataFrame:
    frame = ev.window
    if frame is None or frame.empty:
        raise RuleSkipped("no profiled steps")
    if "analyzed" in frame:
        frame = frame[frame["analyzed"].astype(bool)]
    if device is not None and "device" in frame:
        frame = frame[frame["device"] == device]
    if frame.empty or float(frame["dur_s"].sum()) <= 0:
        raise RuleSkipped(f"no {device} steps with time in them" if device else "no steps")
    return frame


def mean(frame: pd.DataFrame, col: str) -> float:
    if col not in frame:
        return 0.0
    value = float(frame[col].astype("float64").mean())
    return 0.0 if math.isnan(value) else value


def means(frame: pd.DataFrame, *cols: str) -> list[float]:
    """The per-step mean of each column (0 where absent), in order."""
    return [mean(frame, col) for col in cols]


def window_finding(rule_id: str, category: str, *, share: float, bands: tuple[float, float],
                   title: str, evidence: Mapping[str, Any], fixes: Sequence[Fix],
                   step_s: float, removed_s: float) -> Finding:
    """A finding about a share of the window's step: critical and warning from ``bands``, the
    speedup of removing ``removed_s`` seconds of each ``step_s``."""
    return Finding(id=rule_id, category=category, severity=severity(share, *bands), title=title,
                   evidence={**evidence, "step_s": step_s}, fixes=tuple(fixes),
                   estimated_speedup=speedup(step_s, removed_s))


def speedup(step_s: float, removed_s: float) -> float:
    removed_s = min(max(removed_s, 0.0), step_s * 0.95)
    return step_s / (step_s - removed_s) if step_s > 0 else 1.0


def severity(share: float, critical: float = 0.2, warning: float = 0.05) -> str:
    return "critical" if share >= critical else "warning" if share >= warning else "info"
