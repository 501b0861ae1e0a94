"""Frameworks' own words under ``doctor run`` (issue 35, item 5; DeepSpeed's ZeRO, issue 36),
where the frameworks are installed (doctor does not need them, and CI installs none: there these
skip, and tests/unit/test_framework_runs.py checks the same on recordings of these jobs)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support import SAMPLE_JOBS, doctor_cmd, run_sample_job

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


def test_a_deepspeed_zero3_job_is_named_with_deepspeeds_own_fixes(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed")
    if shutil.which("torchrun") is None:
        pytest.skip("torchrun is not on PATH")
    out = tmp_path / "run"
    result = doctor_cmd("run", "--out", str(out), "--", "torchrun", "--nproc-per-node", "2",
                        str(SAMPLE_JOBS / "deepspeed_zero.py"), "--stage", "3", "--steps", "30",
                        timeout=300, env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["job"]["parallelism"].startswith("DeepSpeed ZeRO-3 over 2 ranks (")
    assert "ddp" not in verdict["job"]["parallel_kinds"]
    assert "stats" not in verdict["job"]["parallel_kinds"]  # biases gathered are no statistics
    [exposed] = [f for f in verdict["findings"] if f["id"] == "comm.exposed"]
    words = "\n".join(x["title"] + x["why"] + x["code"] for x in exposed["fixes"])
    for foreign in ("bucket_cap", "no_sync", "compress_hook", "fully_shard", "BatchNorm"):
        assert foreign not in words
    assert "ZeRO stage 3 -> 2" in words and "ds_config = {" in words
    # doctor try sets the fixes' keys in the config the job gives deepspeed.initialize
    tried = doctor_cmd("try", str(out), "--yes", "--fix", "comm.exposed", "--steps", "6",
                       "--repeat", "1", timeout=400, env={"OMP_NUM_THREADS": "1"})
    assert tried.returncode == 0, tried.stderr[-3000:]
    [record] = [json.loads(p.read_text()) for p in out.glob("tries/*/try.json")]
    [stage] = [c for c in record["candidates"]
               if c["label"] == "deepspeed.zero_optimization.stage=2"]
    assert stage["applied"]["deepspeed.zero_optimization.stage"] == {"tried": 2, "job": ["3"]}
    # its gathers before forward and backward gone (measured 1.46x against 1.14x estimated)
    assert stage["speedup"] is not None and stage["speedup"] > 1.1
