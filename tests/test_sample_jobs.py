"""The input-stage sample jobs run, with and without the switch that removes their bottleneck, and
end with the JSON line of ``StepTimer.report``. Tiny sizes: this checks that they work, not how
fast they are (bench/accuracy.py does that)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SAMPLE_JOBS

pytestmark = pytest.mark.e2e

JOBS = {
    "io_bound": ("--cached", ["--files", "2", "--file-mb", "0.25", "--batch", "2"]),
    "decode_bound": ("--predecoded", ["--images", "2", "--size", "64", "--batch", "2"]),
    "preprocess_bound": ("--no-augment", ["--images", "2", "--batch", "2", "--passes", "1"]),
    "collate_bound": ("--fast-collate", ["--sequences", "4", "--max-len", "32", "--batch", "2"]),
}


CASES = [(job, switch) for job in sorted(JOBS) for switch in (False, True)]


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], tuple[
        subprocess.CompletedProcess[str], Path]]:
    """Every case, started together (each is mostly torch's import time) and waited for."""
    started = {}
    for job, switch in CASES:
        flag, small = JOBS[job]
        data = tmp_path_factory.mktemp(f"{job}-{switch}")
        cmd = [sys.executable, str(SAMPLE_JOBS / f"{job}.py"), "--steps", "3",
               "--data", str(data), *small, *([flag] if switch else [])]
        started[job, switch] = (cmd, data, subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    done = {}
    for key, (cmd, data, proc) in started.items():
        try:
            out, err = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        done[key] = (subprocess.CompletedProcess(cmd, proc.returncode, out, err), data)
    return done


@pytest.mark.parametrize(("job", "switch"), CASES,
                         ids=[f"{j}-{'switched' if s else 'bottleneck'}" for j, s in CASES])
def test_sample_job_runs_and_reports(
        finished: dict[tuple[str, bool], tuple[subprocess.CompletedProcess[str], Path]],
        job: str, switch: bool) -> None:
    proc, data = finished[job, switch]
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["job"] == job
    assert report["steps"] == 3
    assert report["median_step_s"] > 0
    assert report["workers"] == 0
    assert any(data.iterdir()), "the job generates its data into --data"
