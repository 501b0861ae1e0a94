"""A job that doctor could not record says why: Python's -I, -E or -S kept the bootstrap out,
or the job ran too few steps to time one; never a false "torch was never imported"."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import doctor_cmd

JOB = """\
import sys
import torch
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(int(sys.argv[1])):
    model(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
"""


def run(tmp_path: Path, *argv: str) -> dict[str, Any]:
    job = tmp_path / "one.py"
    job.write_text(JOB)
    out = tmp_path / "run"
    result = doctor_cmd("run", "--out", str(out), "--", sys.executable, *argv[:-1], str(job),
                        argv[-1], timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(json.loads((out / "verdict.json").read_text()))


@pytest.mark.e2e
def test_python_i_says_the_bootstrap_never_loaded(tmp_path: Path) -> None:
    verdict = run(tmp_path, "-I", "5")
    text = json.dumps(verdict)
    assert "never imported" not in text
    first = verdict["findings"][0]
    assert "-I (isolated mode) ignores PYTHONPATH" in first["title"]
    assert "without -I" in first["fixes"][0]["title"]
    assert verdict["probes"]["steps"]["hint"] == "run the job's Python without -I, -E or -S"


@pytest.mark.e2e
def test_a_one_step_job_says_it_ran_too_few_steps(tmp_path: Path) -> None:
    verdict = run(tmp_path, "1")
    assert "never imported" not in json.dumps(verdict)
    first = verdict["findings"][0]
    assert "the job ran 1 step" in first["title"] and first["fixes"][0]["title"] == \
        "Run more steps"
    assert verdict["probes"]["steps"]["ok"]  # its probes did start


@pytest.mark.e2e
def test_a_job_of_no_steps_does_not_claim_torch_was_never_imported(tmp_path: Path) -> None:
    verdict = run(tmp_path, "0")
    assert "never imported" not in json.dumps(verdict)
    assert "ran no training step" in verdict["findings"][0]["title"]
