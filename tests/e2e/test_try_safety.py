"""``doctor try`` runs nothing it was not allowed to: without a terminal and without ``--yes`` it
prints the plan and exits 2 (the job never starts: the file it would write is absent); what a
received run.json holds is shown escaped (no control character reaches the terminal); and of its
environment only the job-shaping names doctor records are put back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from doctor.reports.escape import escaped, shell_command
from tests.support import MARKER_JOB

ESCAPES = "\x1b[2K\x1b[1A\r\x07\x9b\u202e"  # erase the line, go up, CR, BEL, CSI, RTL override


def doctor(*args: str, cwd: Path, stdin: int | None = subprocess.DEVNULL
           ) -> subprocess.CompletedProcess[bytes]:
    """The doctor CLI with stdin from /dev/null (not a terminal), output as bytes."""
    return subprocess.run([sys.executable, "-m", "doctor.cli", *args], cwd=cwd, stdin=stdin,
                          capture_output=True, timeout=240)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a small job's run directory, the marker file its job writes when it starts), the marker
    removed after the run."""
    root = tmp_path_factory.mktemp("try")
    (root / "job.py").write_text(MARKER_JOB)
    marker = root / "marker.txt"
    ran = doctor("run", "--quiet", "--window", "off", "--out", str(root / "run"), "--",
                 sys.executable, "job.py", str(marker), cwd=root)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert marker.read_text() == "ran\n"
    marker.unlink()
    return root / "run", marker


@pytest.mark.e2e
def test_without_a_terminal_nor_yes_the_plan_is_printed_and_nothing_runs(
        recorded: tuple[Path, Path]) -> None:
    run_dir, marker = recorded
    tried = doctor("try", str(run_dir), "--set", "num_threads=1", cwd=run_dir.parent)
    err = tried.stderr.decode()
    assert tried.returncode == 2, err
    assert "doctor try: re-running" in err  # the plan
    assert err.strip().splitlines()[-1].startswith("doctor: ") and "--yes" in err
    assert "Traceback" not in err
    assert not marker.exists()  # the job never started
    assert not list(run_dir.glob("tries/*"))


@pytest.mark.e2e
def test_escape_sequences_in_the_recorded_argv_are_shown_escaped(
        recorded: tuple[Path, Path], tmp_path: Path) -> None:
    run_dir, marker = recorded
    planted = tmp_path / "run"
    subprocess.run(["cp", "-a", str(run_dir), str(planted)], check=True)
    record = json.loads((planted / "run.json").read_text())
    record["argv"] = [*record["argv"], f"{ESCAPES}python innocent.py", "\udcff"]
    record["cwd"] = record["cwd"] + "\x1b[8m"
    (planted / "run.json").write_text(json.dumps(record))
    tried = doctor("try", str(planted), "--set", "num_threads=1", "--dry-run",
                   cwd=run_dir.parent)
    assert tried.returncode == 0, tried.stderr[-2000:]
    assert not any(b in tried.stderr for b in (b"\x1b", b"\r", b"\x07", b"\xc2\x9b",
                                              "\u202e".encode()))
    shown = tried.stderr.decode()
    assert "$'\\x1b[2K\\x1b[1A\\r\\a\\u009b\\u202epython innocent.py'" in shown
    assert "$'\\xff'" in shown
    assert not marker.exists()


def test_a_shown_command_is_printable_and_what_a_shell_would_run(tmp_path: Path) -> None:
    argv = ["python", "t.py", f"{ESCAPES}rm -rf", "it's", "a b", "back\\slash\t", "\udcfe",
            "\U000e0001tag"]
    line = shell_command(argv)
    assert all(c.isprintable() for c in line)
    out = subprocess.run(["bash", "-c", f'for a in {line}; do printf "%s\\0" "$a"; done'],
                         capture_output=True, check=True).stdout
    assert out.split(b"\0")[:-1] == [os.fsencode(a) for a in argv]
    assert escaped("plain \\ text") == "plain \\ text"
    assert escaped("a\x1bb") == "a\\x1bb"


