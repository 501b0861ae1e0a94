"""The verdict: categories, findings, fixes and the ``verdict.json`` contract (doctor.verdict/1).

These are the shared data types between the rules (which produce findings) and the reports
(which only format them). Nothing in here measures or analyses anything.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .categories import BOTTLENECKS, CATEGORIES, UNSPLIT_INPUT
from .errors import VerdictSchemaError

__all__ = ["BOTTLENECKS", "CATEGORIES", "SCHEMA", "SEVERITIES", "Finding", "Fix",
           "ProbeStatus", "Verdict", "VerdictSchemaError", "check_verdict", "fix_id", "plain"]

SCHEMA = "doctor.verdict/1"

SEVERITIES: tuple[str, ...] = ("critical", "warning", "info")


@dataclass(frozen=True)
class Fix:
    """One change the user can make: what, why it fits this job, and the code.

    ``apply``: the settings ``doctor try`` can change for it without code (doctor.tuning), or
    None where it needs code; ``estimated_speedup``: the step speedup of this fix alone, where
    the rule can estimate it; ``verified``: what a ``doctor try`` of it measured;
    ``frees_bytes``: the memory it frees (or saves), where the rule can work that out.
    """

    title: str
    why: str
    code: str = ""
    apply: Mapping[str, Mapping[str, Any]] | None = None
    estimated_speedup: float | None = None
    verified: Mapping[str, Any] | None = None
    frees_bytes: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"title": self.title, "why": self.why, "code": self.code}
        if self.frees_bytes is not None:
            out["frees_bytes"] = int(self.frees_bytes)
        if self.apply is not None:
            out["apply"] = plain(self.apply)
        if self.estimated_speedup is not None:
            out["estimated_speedup"] = round(float(self.estimated_speedup), 2)
        if self.verified is not None:
            out["verified"] = plain(self.verified)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fix:
        return cls(title=data["title"], why=data.get("why", ""), code=data.get("code", ""),
                   apply=data.get("apply"), estimated_speedup=data.get("estimated_speedup"),
                   verified=data.get("verified"), frees_bytes=data.get("frees_bytes"))


def fix_id(finding_id: str, n: int) -> str:
    """The id of a finding's ``n``-th fix (from 1), as ``doctor try --fix`` takes it."""
    return f"{finding_id}:{n}"


@dataclass(frozen=True)
class Finding:
    """What a rule found, with the numbers that fired it and the fixes that fit."""

    id: str
    category: str
    severity: str
    title: str
    evidence: Mapping[str, Any] = field(default_factory=dict)
    fixes: tuple[Fix, ...] = ()
    estimated_speedup: float | None = None

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity {self.severity!r} is not one of {SEVERITIES}")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["evidence"] = {k: plain(v) for k, v in self.evidence.items()}
        out["fixes"] = [f.to_dict() for f in self.fixes]
        if self.estimated_speedup is not None:
            out["estimated_speedup"] = round(float(self.estimated_speedup), 2)
        return out


@dataclass(frozen=True)
class ProbeStatus:
    """Whether a probe ran; when it did not, why, and what the user can do about it."""

    ok: bool
    reason: str = ""
    hint: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ok": self.ok}
        if self.reason:
            out["reason"] = self.reason
        if self.hint:
            out["hint"] = self.hint
        return out


@dataclass
class Verdict:
    """The verdict.json contract's own keys (doctor.verdict/1). ``bottleneck_share``: the
    bottleneck's share, an input stage's being the whole pipeline's; ``rules_skipped``: rule id
    -> why it did not run. The analysis's sections beside it (gpus, memory, ops, communication)
    are typed records of doctor.analyse, which doctor.reports.json alone turns into its dicts;
    they are not read back (``from_dict``)."""

    bottleneck: str
    shares: dict[str, float]
    steps: dict[str, Any]
    findings: list[Finding]
    probes: dict[str, ProbeStatus]
    job: dict[str, Any]
    partial: bool = False
    notes: list[str] = field(default_factory=list)
    bottleneck_share: float | None = None
    rules_skipped: dict[str, str] = field(default_factory=dict)
    #: Where later profiler windows opened (the run slowed down): each period's steps, window,
    #: bottleneck and shares (doctor.analyse.periods); empty for a run of one window.
    periods: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": SCHEMA,
            "bottleneck": self.bottleneck,
            "shares": {k: round(float(v), 4) for k, v in self.shares.items()},
            "steps": {k: plain(v) for k, v in self.steps.items()},
            "findings": [f.to_dict() for f in self.findings],
            "probes": {k: p.to_dict() for k, p in self.probes.items()},
            "job": {k: plain(v) for k, v in self.job.items()},
            "partial": self.partial,
            "notes": list(self.notes),
            "bottleneck_share": plain(self.bottleneck_share),
            "rules_skipped": plain(self.rules_skipped),
        }
        if self.periods:  # optional: a run whose later windows found periods
            out["periods"] = plain(self.periods)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Verdict:
        check_verdict(data)
        return cls(
            bottleneck=data["bottleneck"],
            shares=dict(data["shares"]),
            steps=dict(data["steps"]),
            findings=[
                Finding(
                    id=f["id"], category=f["category"], severity=f["severity"],
                    title=f["title"], evidence=dict(f.get("evidence", {})),
                    fixes=tuple(Fix.from_dict(fx) for fx in f.get("fixes", [])),
                    estimated_speedup=f.get("estimated_speedup"),
                )
                for f in data["findings"]
            ],
            probes={k: ProbeStatus(**v) for k, v in data["probes"].items()},
            job=dict(data["job"]),
            partial=bool(data.get("partial", False)),
            notes=list(data.get("notes", [])),
            bottleneck_share=data.get("bottleneck_share"),
            rules_skipped=dict(data.get("rules_skipped") or {}),
            periods=[dict(p) for p in data.get("periods") or [] if isinstance(p, Mapping)],
        )


def check_verdict(data: Mapping[str, Any]) -> None:
    """Raise VerdictSchemaError unless ``data`` follows the doctor.verdict/1 contract."""
    if data.get("schema") != SCHEMA:
        raise VerdictSchemaError(f"schema is {data.get('schema')!r}, expected {SCHEMA!r}")
    for key in ("bottleneck", "shares", "steps", "findings", "probes", "job"):
        if key not in data:
            raise VerdictSchemaError(f"missing key {key!r}")
    allowed = {*BOTTLENECKS, UNSPLIT_INPUT, "unknown"}
    if data["bottleneck"] not in allowed:
        raise VerdictSchemaError(
            f"bottleneck {data['bottleneck']!r} is not one of {sorted(allowed)}")
    shares = data["shares"]
    missing = [c for c in CATEGORIES if c not in shares]
    if missing:
        raise VerdictSchemaError(f"shares lack {missing}")
    total = sum(float(v) for v in shares.values())
    if shares and total > 0 and not math.isclose(total, 1.0, abs_tol=0.02):
        raise VerdictSchemaError(f"shares sum to {total:.3f}, not 1")
    for f in data["findings"]:
        if f.get("severity") not in SEVERITIES:
            raise VerdictSchemaError(f"finding {f.get('id')!r} has severity {f.get('severity')!r}")


def plain(value: Any) -> Any:
    """Turn numpy scalars and NaN into JSON-friendly values (NaN becomes null)."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return None
        return round(value, 6)
    return value


#: Columns of the step ledger (doctor.analyse.ledger builds it; reports read it).
LEDGER_COLUMNS: tuple[str, ...] = (
    "rank", "step", "start_s", "wall_s", *CATEGORIES, "warmup", "analyzed",
)
