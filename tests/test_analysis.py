"""The verdict of recorded runs (fake clock, no job): categories, shares, partial runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from doctor.analysis import analyze_run
from doctor.outputs import finalize_run
from doctor.verdict import CATEGORIES, check_verdict
from tests.loops import record_loop, write_record


def test_input_bound_run(tmp_path: Path) -> None:
    record_loop(tmp_path, 40, wait_s=0.09, compute_s=0.01)
    write_record(tmp_path, cores=8)
    verdict = analyze_run(tmp_path).verdict
    assert verdict.bottleneck == "input"  # no stack samples: the wait cannot be split
    assert verdict.shares["input"] == pytest.approx(0.9, abs=0.01)
    assert verdict.shares["preprocess"] == 0
    assert verdict.steps["count"] == 39
    assert verdict.steps["analyzed"] < 39  # warm-up left out
    ids = [f.id for f in verdict.findings]
    assert ids[:2] == ["input.loader", "input.unsplit"]
    assert "set num_workers=7" in verdict.findings[0].fixes[0].title
    assert not verdict.partial
    assert any("warm-up" in n for n in verdict.notes)


def test_compute_bound_run(tmp_path: Path) -> None:
    record_loop(tmp_path, 40, wait_s=0.001, compute_s=0.05)
    write_record(tmp_path)
    verdict = analyze_run(tmp_path).verdict
    assert verdict.bottleneck == "compute"
    assert verdict.shares["compute"] > 0.95
    assert "compute.bound" in [f.id for f in verdict.findings]
    assert abs(sum(verdict.shares.values()) - 1) < 1e-6
    assert set(CATEGORIES) <= set(verdict.shares)


def test_a_run_that_crashed_is_partial_and_says_so(tmp_path: Path) -> None:
    record_loop(tmp_path, 25, wait_s=0.01, compute_s=0.02)
    write_record(tmp_path, exit_code=1)
    verdict = analyze_run(tmp_path).verdict
    assert verdict.partial
    assert any("exited with status 1" in n for n in verdict.notes)
    assert verdict.bottleneck == "compute"


def test_a_killed_run_is_partial(tmp_path: Path) -> None:
    record_loop(tmp_path, 25)
    write_record(tmp_path, exit_code=137, signal=9)
    verdict = analyze_run(tmp_path).verdict
    assert verdict.partial
    assert any("signal 9" in n for n in verdict.notes)


def test_no_steps_means_unknown_with_the_reason(tmp_path: Path) -> None:
    write_record(tmp_path)
    verdict = analyze_run(tmp_path).verdict
    assert verdict.bottleneck == "unknown"
    assert verdict.findings[0].id == "steps.none"
    assert "doctor.step()" in verdict.findings[0].fixes[0].code
    assert all(v == 0 for v in verdict.shares.values())


def test_finalize_writes_a_valid_verdict_and_a_report(tmp_path: Path) -> None:
    record_loop(tmp_path, 30, wait_s=0.02, compute_s=0.02)
    write_record(tmp_path, probes={"gpu": {"ok": False, "reason": "NVML library not found"}})
    finalize_run(tmp_path)
    data = json.loads((tmp_path / "verdict.json").read_text())
    check_verdict(data)
    assert data["probes"]["gpu"] == {"ok": False, "reason": "NVML library not found"}
    assert data["job"]["argv"] == ["python", "train.py"]
    html = (tmp_path / "report.html").read_text()
    assert "NVML library not found" in html


def test_few_steps_are_all_counted_with_a_note(tmp_path: Path) -> None:
    record_loop(tmp_path, 3, wait_s=0.02, compute_s=0.02)
    write_record(tmp_path)
    verdict = analyze_run(tmp_path).verdict
    assert verdict.steps["count"] == 2
    assert verdict.steps["analyzed"] >= 1
    assert any("firmer verdict" in n for n in verdict.notes)
