"""Two analyses side by side (``doctor compare``): step time, speedup, shares, settings.

The result is a Comparison; ``to_dict`` is what ``doctor compare --format json`` prints, and
``from_dict`` reads that back after a check of its shape (RecordSchemaError, one line).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from doctor.analyse.analysis import Analysis
from doctor.categories import CATEGORIES
from doctor.errors import RecordSchemaError
from doctor.step_pace import pace

#: Job facts worth putting side by side when they differ (``command``: the job's argv as typed,
#: secrets already redacted: two runs of different commands are two jobs, not one changed).
SETTINGS = ("command", "device", "ranks", "cores", "torch_threads", "num_workers", "pin_memory",
            "batch_size")
SIDE_KEYS = ("source", "bottleneck", "median_step_s", "steps", "shares", "settings")


@dataclass(frozen=True)
class Side:
    """One of the two runs: where it is, its verdict's figures and its settings."""

    source: str
    bottleneck: str
    median_step_s: float | None
    steps: int | None  # the steps analysed
    shares: Mapping[str, float]
    settings: Mapping[str, Any]  # SETTINGS -> its value (None: not known)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "bottleneck": self.bottleneck,
                "median_step_s": self.median_step_s, "steps": self.steps,
                "shares": dict(self.shares), "settings": dict(self.settings)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Side:
        return cls(**{k: data[k] for k in SIDE_KEYS})


@dataclass(frozen=True)
class ShareChange:
    """One category's share in A and in B, and B's minus A's."""

    a: float
    b: float
    delta: float


@dataclass(frozen=True)
class Comparison:
    """B against A: ``speedup`` is A's time a step over B's, each its analysed steps' pace
    (doctor.step_pace, as doctor try measures; the median step where a side has no ledger;
    above 1: B is faster; None: a side has no steps); ``settings``: the SETTINGS that differ,
    (A's, B's)."""

    a: Side
    b: Side
    speedup: float | None
    shares: Mapping[str, ShareChange]
    settings: Mapping[str, tuple[Any, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a.to_dict(), "b": self.b.to_dict(), "speedup": self.speedup,
                "shares": {c: {"a": s.a, "b": s.b, "delta": s.delta}
                           for c, s in self.shares.items()},
                "settings": {k: (va, vb) for k, (va, vb) in self.settings.items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Comparison:
        check_comparison(data)
        return cls(a=Side.from_dict(data["a"]), b=Side.from_dict(data["b"]),
                   speedup=data["speedup"],
                   shares={c: ShareChange(s["a"], s["b"], s["delta"])
                           for c, s in data["shares"].items()},
                   settings={k: (pair[0], pair[1]) for k, pair in data["settings"].items()})


def check_comparison(data: Mapping[str, Any]) -> None:
    """Raise RecordSchemaError unless ``data`` has a comparison's shape (Comparison.to_dict)."""
    if not isinstance(data, Mapping):
        raise RecordSchemaError("a comparison is a JSON object")
    for key in ("a", "b", "speedup", "shares", "settings"):
        if key not in data:
            raise RecordSchemaError(f"the comparison lacks {key!r}")
    for side in ("a", "b"):
        if not isinstance(data[side], Mapping) or any(k not in data[side] for k in SIDE_KEYS):
            raise RecordSchemaError(f"the comparison's side {side!r} lacks one of {SIDE_KEYS}")
    if any(not isinstance(s, Mapping) or {"a", "b", "delta"} - set(s)
           for s in data["shares"].values()):
        raise RecordSchemaError("each of the comparison's shares has a, b and delta")
    if any(not isinstance(p, list | tuple) or len(p) != 2 for p in data["settings"].values()):
        raise RecordSchemaError("each of the comparison's settings is a pair (A's, B's)")


def compare(a: Analysis, b: Analysis) -> Comparison:
    """B against A."""
    sa, sb = _side(a), _side(b)
    ma, mb = _pace(a) or sa.median_step_s, _pace(b) or sb.median_step_s
    cats = [c for c in (*CATEGORIES, "input")
            if c in a.verdict.shares or c in b.verdict.shares]
    shares = {}
    for c in cats:
        in_a, in_b = float(a.verdict.shares.get(c, 0.0)), float(b.verdict.shares.get(c, 0.0))
        shares[c] = ShareChange(in_a, in_b, in_b - in_a)
    settings = {}
    for key in SETTINGS:
        va, vb = sa.settings.get(key), sb.settings.get(key)
        if va != vb:
            settings[key] = (va, vb)
    return Comparison(a=sa, b=sb, speedup=ma / mb if ma and mb else None, shares=shares,
                      settings=settings)


def _pace(analysis: Analysis) -> float | None:
    """The pace of the analysed steps of ``analysis``'s ledger (None: none)."""
    ledger = analysis.ledger
    if ledger is None or ledger.empty or not {"analyzed", "wall_s"} <= set(ledger):
        return None
    return pace([float(x) for x in ledger.loc[ledger["analyzed"].astype(bool), "wall_s"]])


def _side(analysis: Analysis) -> Side:
    v = analysis.verdict
    job = dict(v.job)
    if isinstance(job.get("argv"), list | tuple):
        job["command"] = " ".join(str(x) for x in job["argv"])
    loaders = analysis.tables.loaders
    if loaders is not None and not loaders.empty:
        first = loaders.iloc[0]
        for key in ("num_workers", "pin_memory", "batch_size"):
            if key in loaders:
                job[key] = first[key].item() if hasattr(first[key], "item") else first[key]
    return Side(source=analysis.source, bottleneck=v.bottleneck,
                median_step_s=v.steps.get("median_s"), steps=v.steps.get("analyzed"),
                shares=dict(v.shares), settings={k: job.get(k) for k in SETTINGS})
