from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from doctor.command import resolve_command
from doctor.errors import UsageError


def test_a_bare_script_runs_with_this_python(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    job = resolve_command([str(script), "--lr", "0.1"])
    assert job.argv == [sys.executable, str(script), "--lr", "0.1"]
    assert job.name == "train"


def test_python_commands_run_as_typed(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    job = resolve_command(["python", "-u", str(script), "x"])
    assert job.argv == ["python", "-u", str(script), "x"]
    assert job.name == "train"
    assert resolve_command(["python", "-m", "pkg.train"]).name == "train"


def test_console_scripts_with_a_python_shebang_are_accepted(tmp_path: Path) -> None:
    launcher = tmp_path / "torchrun"
    launcher.write_text("#!/usr/bin/env python3\nprint('hi')\n")
    launcher.chmod(0o755)
    job = resolve_command([str(launcher), "--nproc-per-node", "2", "train.py"])
    assert job.name == "train"


@pytest.mark.parametrize("words, message", [
    ([], "no command given"),
    (["missing.py"], "no such script: missing.py"),
    (["python", "missing.py"], "no such script: missing.py"),
    (["no-such-command-xyz"], "command not found"),
    (["ls", "-l"], "is not a Python command"),
    (["python"], "needs a script or -m module"),
])
def test_refusals_say_why(words: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        resolve_command(words)


def test_shell_scripts_are_not_python(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o755)
    with pytest.raises(UsageError, match="not a Python command"):
        resolve_command([str(script)])
    assert os.access(script, os.X_OK)
