"""The optimizer as its own cost under ``doctor run`` (issue 35, item 4): Adam over 400 small
tensors, updated one at a time, is named with fused=True; built fused, it is not. The
recorded-loop tests are in tests/unit/test_optimizer_cost.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import run_sample_job

pytestmark = pytest.mark.e2e


def test_a_looping_adam_is_told_fused_and_a_fused_one_is_not(tmp_path: Path) -> None:
    job, verdict = run_sample_job(tmp_path / "bare", "optimizer_bound.py", "--steps", "60")
    [found] = [f for f in verdict["findings"] if f["id"] == "optimizer.unfused"]
    assert found["evidence"]["tensors"] == job["tensors"]
    assert found["fixes"][0]["code"].endswith("fused=True)")
    assert found["estimated_speedup"] > 1.1
    _job, fixed = run_sample_job(tmp_path / "fixed", "optimizer_bound.py", "--steps", "60",
                                 "--fixed")
    assert "optimizer.unfused" not in {f["id"] for f in fixed["findings"]}
