"""A try's measurement shown beside the fix it tried, in the verdict and in the reports."""

from __future__ import annotations

import json
from pathlib import Path

from doctor.analyse.verified import attach_verified
from doctor.reports.verified import verified_line
from doctor.store.tries import read_tries, write_try
from doctor.store.try_record import TryRecord
from doctor.verdict import Finding, Fix

FIX = Fix("set num_workers=2", "why", apply={"dataloader": {"num_workers": 2}},
          estimated_speedup=3.2)
FINDING = Finding("input.loader", "preprocess", "critical", "waits",
                  fixes=(FIX, Fix("needs code", "why")))


def record(speedup: float, apply: dict | None = None, outcome: str = "faster") -> TryRecord:
    return TryRecord.from_dict({"repeat": 2, "dir": "tries/x", "candidates": [{
        "id": "input.loader:1", "apply": apply or {"dataloader": {"num_workers": "2"}},
        "outcome": outcome, "why": "the job exited with status 1" if outcome == "failed" else "",
        "speedup": speedup, "low": 2.7, "high": 3.1, "steps": 30}]})


def test_the_newest_try_of_a_fixs_settings_is_attached() -> None:
    [got] = attach_verified([FINDING], [record(1.5), record(2.9)])
    v = got.fixes[0].verified
    assert v is not None
    assert v["speedup"] == 2.9 and v["estimated"] == 3.2
    assert abs(v["ratio"] - 2.9 / 3.2) < 1e-9
    assert got.fixes[1].verified is None  # not tried: it needs code
    assert verified_line(v) == "verified: measured 2.90x (2.7-3.1), estimated 3.20x"
    out = got.to_dict()["fixes"][0]
    assert out["verified"]["speedup"] == 2.9 and out["apply"] == {"dataloader":
                                                                 {"num_workers": 2}}


def test_another_setting_is_not_this_fixs_and_a_failure_says_so() -> None:
    [got] = attach_verified([FINDING], [record(2.0, {"dataloader": {"num_workers": 4}})])
    assert got.fixes[0].verified is None
    [failed] = attach_verified([FINDING], [record(0.0, outcome="failed")])
    assert failed.fixes[0].verified is not None
    assert verified_line(failed.fixes[0].verified) == "tried: the job exited with status 1"


def test_try_records_round_trip_and_foreign_files_are_left_out(tmp_path: Path) -> None:
    first = tmp_path / "tries" / "20260101-000000"
    first.mkdir(parents=True)
    write_try(first, record(2.0))
    other = tmp_path / "tries" / "20260101-000001"
    other.mkdir()
    (other / "try.json").write_text(json.dumps({"schema": "something/9"}))
    [got] = read_tries(tmp_path)
    assert got.dir == "tries/20260101-000000"
    assert got.candidates[0].speedup == 2.0
