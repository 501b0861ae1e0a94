from __future__ import annotations

import json
from pathlib import Path

import pytest

from doctor.verdict import (
    CATEGORIES,
    SCHEMA,
    Finding,
    Fix,
    ProbeStatus,
    Verdict,
    VerdictSchemaError,
    check_verdict,
)


def verdict() -> Verdict:
    shares = dict.fromkeys(CATEGORIES, 0.0)
    shares.update(decode=0.8, compute=0.2)
    return Verdict(
        bottleneck="decode", shares=shares, steps={"count": 80, "analyzed": 70, "median_s": 0.09},
        findings=[Finding("input.decode", "decode", "critical", "Decoding", {"x": 1.5},
                          (Fix("a", "b", "c = 1"),), 5.2)],
        probes={"gpu": ProbeStatus(False, "NVML library not found")},
        job={"argv": ["python", "train.py"], "exit_code": 0, "ranks": 1, "device": "cpu"},
    )


def test_round_trip_through_json(tmp_path: Path) -> None:
    v = verdict()
    (tmp_path / "verdict.json").write_text(json.dumps(v.to_dict()))
    data = json.loads((tmp_path / "verdict.json").read_text())
    assert data["schema"] == SCHEMA
    assert data["probes"]["gpu"] == {"ok": False, "reason": "NVML library not found"}
    again = Verdict.from_dict(data)
    assert again.to_dict() == data


def test_schema_check_catches_what_tools_rely_on() -> None:
    good = verdict().to_dict()
    check_verdict(good)
    for broken in (
        {**good, "schema": "doctor.verdict/0"},
        {**good, "bottleneck": "gpu"},
        {**good, "shares": {"io": 1.0}},
        {**good, "shares": {**good["shares"], "compute": 0.9}},
        {k: v for k, v in good.items() if k != "probes"},
    ):
        with pytest.raises(VerdictSchemaError):
            check_verdict(broken)


def test_severity_must_be_known() -> None:
    with pytest.raises(ValueError):
        Finding("x", "io", "fatal", "t")


def test_nan_evidence_becomes_null() -> None:
    f = Finding("x", "io", "info", "t", {"ratio": float("nan")})
    assert f.to_dict()["evidence"]["ratio"] is None
