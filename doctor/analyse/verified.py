"""What ``doctor try`` measured, beside the fixes it tried: each fix whose settings a try of
the run applied alone gets ``verified`` (the newest such try), with the estimate it checked."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from doctor.tuning import key_of
from doctor.verdict import Finding, Fix


def attach_verified(findings: Sequence[Finding], tries: Sequence[Mapping[str, Any]]
                    ) -> list[Finding]:
    measured: dict[str, dict[str, Any]] = {}
    for record in tries:  # oldest first: a newer try of the same setting wins
        for c in record.get("candidates") or []:
            try:
                key = key_of(c.get("apply") or {})
            except (ValueError, TypeError):
                continue
            measured[key] = {
                "outcome": c.get("outcome"), "why": c.get("why"), "speedup": c.get("speedup"),
                "low": c.get("low"), "high": c.get("high"), "steps": c.get("steps"),
                "repeat": record.get("repeat"), "try": record.get("dir"),
                "unsure": record.get("unsteady"),
            }
    if not measured:
        return list(findings)
    return [replace(f, fixes=tuple(_verified(fix, measured) for fix in f.fixes))
            for f in findings]


def _verified(fix: Fix, measured: Mapping[str, dict[str, Any]]) -> Fix:
    if fix.apply is None:
        return fix
    try:
        got = measured.get(key_of(fix.apply))
    except (ValueError, TypeError):
        return fix
    if got is None:
        return fix
    estimate = fix.estimated_speedup
    speedup = got.get("speedup")
    return replace(fix, verified={**got, "estimated": estimate,
                                  "ratio": speedup / estimate if speedup and estimate else None})
