"""What ``doctor try`` measured, beside the fixes it tried: each fix whose settings a try of
the run applied alone gets ``verified`` (the newest such try), with the estimate it checked."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from doctor.store.try_record import TryRecord
from doctor.tuning import key_of
from doctor.verdict import Finding, Fix


def attach_verified(findings: Sequence[Finding], tries: Sequence[TryRecord]) -> list[Finding]:
    measured: dict[str, dict[str, Any]] = {}
    for record in tries:  # oldest first: a newer try of the same setting wins
        for c in record.candidates:
            try:
                key = key_of(c.apply or {})
            except (ValueError, TypeError):
                continue
            measured[key] = {
                "outcome": c.outcome, "why": c.why, "speedup": c.speedup,
                "low": c.low, "high": c.high, "steps": c.steps,
                "repeat": record.repeat, "try": record.dir or None,
                "unsure": record.unsteady,
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
