"""Iterations a GradScaler skipped, under ``doctor run`` (issue 35, item 1): each counted as an
iteration of its own, and as many as the job counted itself; none said where none were skipped.
The recorded-loop tests are in tests/unit/test_skipped_iterations.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import SAMPLE_JOBS, run_sample_job

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


def test_mixed_precision_as_the_job_ran_it(tmp_path: Path) -> None:
    """fp16 autocast on the CPU, inf losses every third iteration, 3 micro-batches each: the
    autocast named, the losses counted as the job counted them, the micro-batches its own."""
    job, verdict = run_sample_job(tmp_path / "run", "amp_skips.py", "--steps", "45",
                                  "--overflow", "loss", "--accumulate", "3")
    assert verdict["job"]["autocast"] == ["cpu:float16"]
    assert verdict["steps"]["micro_batches"] == job["micro_batches"] == 3
    assert verdict["steps"]["skipped"] == job["skipped"] == 15
    [found] = [f for f in verdict["findings"] if f["id"] == "steps.skipped"]
    assert found["evidence"]["nonfinite_losses"] == job["nonfinite_losses"] == 45
    assert found["evidence"]["scale_lowest_log2"] == -7  # 2^8 halved 15 times
    assert "loss.nonfinite" not in {f["id"] for f in verdict["findings"]}


def test_the_layer_whose_gradients_overflow_is_named(tmp_path: Path) -> None:
    """Four hidden blocks, the third's output gradient overflowing every third iteration: the
    finding names fc2, as the job says; the job's last loss and weights are those it reaches
    without doctor."""
    args = ("--steps", "45", "--layers", "4", "--overflow-at", "2", "--width", "128")
    job, verdict = run_sample_job(tmp_path / "run", "amp_skips.py", *args)
    [found] = [f for f in verdict["findings"] if f["id"] == "steps.skipped"]
    ev = found["evidence"]
    assert ev["overflow_layer"] == f"{job['overflow_layer']} (Linear)"
    assert ev["overflow_first_in"] == ev["overflow_read"] >= 2
    assert ev["overflow_then"] == "fc1, fc0"  # the blocks before it take inf from it
    assert f"first overflowed in {job['overflow_layer']} (Linear)" in found["title"]
    assert found["fixes"][0]["title"].startswith(f"Keep {job['overflow_layer']} (Linear)")
    report = (tmp_path / "run" / "report.html").read_text()
    assert f"first overflowed in {job['overflow_layer']} (Linear)" in report
    bare = subprocess.run([sys.executable, str(SAMPLE_JOBS / "amp_skips.py"), *args],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, check=True)
    [alone] = [json.loads(line) for line in bare.stdout.splitlines()
               if line.startswith('{"median_step_s"')]
    assert (alone["final_loss"], alone["weights_sum"], alone["skipped"]) == \
        (job["final_loss"], job["weights_sum"], job["skipped"])


def test_the_layer_whose_output_overflows_is_named(tmp_path: Path) -> None:
    """Block 1's fp16 output overflowing every third iteration: the loss is inf, and the finding
    names fc1 as the first module whose output was, as the job says."""
    job, verdict = run_sample_job(tmp_path / "run", "amp_skips.py", "--steps", "30", "--layers",
                                  "3", "--overflow", "output", "--overflow-at", "1",
                                  "--width", "64")
    assert job["nonfinite_losses"] == job["skipped"] == 10
    [found] = [f for f in verdict["findings"] if f["id"] == "steps.skipped"]
    assert found["evidence"]["overflow_forward_layer"] == f"{job['overflow_layer']} (Linear)"
    assert found["fixes"][0]["title"] == \
        f"Keep {job['overflow_layer']} (Linear) in range: its outputs overflow first"
