"""Iterations a GradScaler skipped, under ``doctor run`` (issue 35, item 1): each counted as an
iteration of its own, and as many as the job counted itself; none said where none were skipped.
The recorded-loop tests are in tests/unit/test_skipped_iterations.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import run_sample_job

pytestmark = pytest.mark.e2e


def run_amp_skips(tmp_path: Path, skip_every: int) -> tuple[dict, dict]:
    return run_sample_job(tmp_path / "run", "amp_skips.py", "--steps", "60",
                          "--skip-every", str(skip_every))


def test_the_skipped_iterations_are_the_jobs_own(tmp_path: Path) -> None:
    job, verdict = run_amp_skips(tmp_path, 3)
    assert job["skipped"] == 20
    assert verdict["steps"]["count"] == job["iterations"] - 1  # not merged in pairs
    [found] = [f for f in verdict["findings"] if f["id"] == "steps.skipped"]
    assert found["evidence"]["skipped"] == job["skipped"]
    assert found["evidence"]["iterations"] == job["iterations"]


def test_no_skips_no_word(tmp_path: Path) -> None:
    job, verdict = run_amp_skips(tmp_path, 0)
    assert job["skipped"] == 0
    assert verdict["steps"]["count"] == job["iterations"] - 1
    assert "steps.skipped" not in {f["id"] for f in verdict["findings"]}
