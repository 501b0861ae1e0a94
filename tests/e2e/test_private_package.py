"""Invisible to the job's imports: under ``doctor run`` doctor's in-job code has a private
package name, nothing heavy is imported before the job's first line, and a project's own
``doctor`` package is the one it imports, while ``doctor.step()`` of ours still reaches the
bootstrap's Session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT, doctor_cmd

pytestmark = pytest.mark.e2e

FIRST_LINE = """
import json, os, sys
json.dump(sorted(m for m in sys.modules
                 if m.split(".")[0] in ("doctor", "numpy", "torch", "pandas")),
          open(os.environ["MODULES_OUT"], "w"))
"""

TRAIN = """
import torch
from doctor import VALUE, helper     # the project's own package, not the profiler
assert VALUE == "the project's own" and helper.double(2) == 4, VALUE
model = torch.nn.Linear(32, 32)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(16):
    opt.zero_grad()
    model(torch.randn(8, 32)).sum().backward()
    opt.step()
import sys
print("VICTIM_TEXT", sorted(m for m in sys.modules if m == "doctor" or m.startswith("doctor.")))
"""


def test_nothing_of_doctor_nor_numpy_is_imported_before_the_jobs_first_line(
        tmp_path: Path) -> None:
    (tmp_path / "first.py").write_text(FIRST_LINE)
    out = tmp_path / "modules.json"
    done = doctor_cmd("run", "--quiet", "--out", str(tmp_path / "run"), "first.py",
                      cwd=tmp_path, env={"MODULES_OUT": str(out)})
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text()) == []


def test_a_projects_own_doctor_package_is_the_one_it_imports(tmp_path: Path) -> None:
    own = tmp_path / "doctor"
    own.mkdir()
    (own / "__init__.py").write_text('VALUE = "the project\'s own"\n')
    (own / "helper.py").write_text("def double(x):\n    return 2 * x\n")
    (tmp_path / "train.py").write_text(TRAIN)
    run = tmp_path / "run"
    done = doctor_cmd("run", "--quiet", "--out", str(run), "--window", "4,3", "train.py",
                      cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "VICTIM_TEXT ['doctor', 'doctor.helper']" in done.stdout
    verdict = json.loads((run / "verdict.json").read_text())
    assert verdict["steps"]["count"] >= 15  # the profiler recorded the job all the same
    assert verdict["probes"]["torch_ops"]["ok"], verdict["probes"]["torch_ops"]


def test_doctor_step_in_the_job_reaches_the_bootstraps_session(tmp_path: Path) -> None:
    """A loop with no optimizer marks its steps with the public doctor.step(): under doctor run
    the public module (a second copy) defers to the private one's Session."""
    (tmp_path / "loop.py").write_text(
        "import time, torch, doctor\n"
        "for _ in range(12):\n"
        "    torch.ones(4).sum()\n"
        "    time.sleep(0.01)\n"
        "    doctor.step()\n")
    run = tmp_path / "run"
    done = doctor_cmd("run", "--quiet", "--window", "off", "--out", str(run), "loop.py",
                      cwd=tmp_path, env={"PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert json.loads((run / "verdict.json").read_text())["steps"]["count"] >= 11


def test_the_bootstrap_adds_little_to_a_python_start(tmp_path: Path) -> None:
    """A process that imports nothing of torch pays the private package's few modules only:
    no numpy, no torch, no pandas, and nothing of the public ``doctor``."""
    env = {**os.environ, "DOCTOR_RUN_DIR": str(tmp_path),
           "PYTHONPATH": str(ROOT / "doctor" / "record" / "_bootstrap")}
    done = subprocess.run(
        [sys.executable, "-c", "import sys; print(sorted(m for m in sys.modules "
         "if m.split('.')[0] in ('numpy', 'torch', 'pandas', 'doctor', '_doctor_job')))"],
        env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    loaded = eval(done.stdout)
    assert loaded and all(m.startswith("_doctor_job") for m in loaded), loaded


