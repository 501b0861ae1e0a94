"""The bootstrap's sitecustomize parses on any Python from 2.7: a Python 2 child of the job
prints nothing of doctor's (a syntax error there printed "'import sitecustomize' failed" into
the job's output) and still runs the sitecustomize it shadows.

The tests here start processes (tests/e2e)."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from doctor.job_record import BOOTSTRAP_DIR


def old_pythons() -> list[str]:
    found = [shutil.which(name) for name in ("python2.7", "python2")]
    found += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/2.7*/bin/python2.7")))
    usable = []
    for exe in dict.fromkeys(p for p in found if p):
        try:
            ok = subprocess.run([exe, "-c", "pass"], capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if ok.returncode == 0:
            usable.append(exe)
    return usable[:1]


def test_the_bootstrap_compiles_as_python_2_would_read_it() -> None:
    """No f-strings and no annotations: what Python 2 cannot parse (checked without one)."""
    text = (BOOTSTRAP_DIR / "sitecustomize.py").read_text()
    assert 'f"' not in text and "f'" not in text
    assert not re.search(r"^\s*def .*\)\s*->", text, re.M)  # annotations (type comments: fine)


@pytest.mark.e2e
@pytest.mark.parametrize("python", old_pythons() or [pytest.param(
    "", marks=pytest.mark.skip(reason="no Python 2.7 on this machine"))])
def test_a_python_2_child_prints_only_its_own_output(python: str, tmp_path: Path) -> None:
    shadowed = tmp_path / "site"
    shadowed.mkdir()
    (shadowed / "sitecustomize.py").write_text("print('the shadowed sitecustomize ran')\n")
    env = {**os.environ, "PYTHONPATH": f"{BOOTSTRAP_DIR}{os.pathsep}{shadowed}",
           "DOCTOR_RUN_DIR": str(tmp_path / "run")}
    ran = subprocess.run([python, "-c", "print('hi')"], capture_output=True, text=True,
                         env=env, timeout=60)
    assert ran.returncode == 0 and ran.stderr == ""
    assert ran.stdout.splitlines() == ["the shadowed sitecustomize ran", "hi"]
