"""Frameworks' own words under ``doctor run`` (issue 35, item 5), where the frameworks are
installed (doctor does not need them, and CI installs none: there these skip, and
tests/unit/test_framework_runs.py checks the same on recordings of these jobs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import run_sample_job

pytestmark = pytest.mark.e2e


def test_a_trainer_job_is_told_dataloader_num_workers(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="the Hugging Face Trainer is not installed")
    pytest.importorskip("accelerate", reason="the Trainer needs accelerate, not installed")
    _job, verdict = run_sample_job(tmp_path, "hf_trainer_input.py", "--steps", "40")
    assert verdict["job"]["framework"].startswith("Hugging Face Trainer ")
    codes = "\n".join(x["code"] for f in verdict["findings"] for x in f["fixes"])
    assert "dataloader_num_workers=" in codes and "batch_size=None" not in codes


def test_lightnings_closure_is_not_the_optimizers_cost(tmp_path: Path) -> None:
    pytest.importorskip("lightning", reason="PyTorch Lightning is not installed")
    _job, verdict = run_sample_job(tmp_path, "lightning_optimizer.py", "--steps", "60")
    assert verdict["job"]["framework"].startswith("PyTorch Lightning ")
    [found] = [f for f in verdict["findings"] if f["id"] == "optimizer.unfused"]
    assert found["evidence"]["optimizer_share"] < 0.7  # 0.94 with the closure's work in it
    assert "def configure_optimizers(self):" in found["fixes"][0]["code"]
