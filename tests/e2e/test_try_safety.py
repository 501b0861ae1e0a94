"""``doctor try`` runs nothing it was not allowed to: without a terminal and without ``--yes`` it
prints the plan and exits 2 (the job never starts: the file it would write is absent); what a
received run.json holds is shown escaped (no control character reaches the terminal); and of its
environment only the job-shaping names doctor records are put back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from doctor.store.rundir import write_run_record
from doctor.tries.attempt import recorded_job, restorable
from doctor.tries.escape import escaped, shell_command
from tests.conftest import ROOT

JOB = textwrap.dedent("""
    import sys
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    open(sys.argv[1], "a").write("ran\\n")  # the marker: the job started
    model = torch.nn.Linear(32, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(640, 32), torch.randint(0, 4, (640,)))
    for x, y in DataLoader(data, batch_size=32):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
""")
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
    (root / "job.py").write_text(JOB)
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


def test_only_the_job_shaping_environment_is_put_back(tmp_path: Path) -> None:
    write_run_record(tmp_path, {"argv": ["python", "train.py"], "name": "train", "env": {
        "OMP_NUM_THREADS": "1", "LD_PRELOAD": "/tmp/evil.so", "BASH_ENV": "/tmp/evil.sh",
        "PYTHONPATH": "/tmp/evil", "PYTHONSTARTUP": "/tmp/evil.py", "PATH": "/tmp/evil",
        "LD_LIBRARY_PATH": "/tmp/evil", "CUDA_VISIBLE_DEVICES": 3, "NCCL_DEBUG": "INFO\0x",
        "TORCH_\x1b[2Kname": "x"}})
    now = {"PATH": "/usr/bin", "PYTHONPATH": "/mine", "HOME": "/root", "OMP_NUM_THREADS": "8"}
    job = recorded_job(tmp_path, now=now)
    assert job.env == {"PATH": "/usr/bin", "PYTHONPATH": "/mine", "HOME": "/root",
                       "OMP_NUM_THREADS": "1"}
    [dropped] = [n for n in job.notes if n.startswith("not restored")]
    for name in ("BASH_ENV", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "LD_PRELOAD",
                 "NCCL_DEBUG", "PATH", "PYTHONPATH", "PYTHONSTARTUP", "TORCH_\\x1b[2Kname"):
        assert name in dropped
    assert all(c.isprintable() for n in job.notes for c in n)
    assert not restorable("LD_PRELOAD") and restorable("NCCL_DEBUG")


@pytest.mark.parametrize("argv", ["python train.py", [1, 2], {"a": 1}])
def test_a_recorded_argv_that_is_not_a_list_of_strings_is_refused(tmp_path: Path,
                                                                   argv: object) -> None:
    from doctor.errors import UsageError

    write_run_record(tmp_path, {"argv": argv, "name": "train", "env": {}})
    with pytest.raises(UsageError, match="not a list of strings"):
        recorded_job(tmp_path, now={})


def test_the_cli_never_runs_without_yes_when_stdin_is_no_terminal() -> None:
    """The decision itself (doctor.cli._allowed_to_run), without a job."""
    from doctor import cli
    from doctor.errors import UsageError

    assert ROOT.is_dir()
    with open(os.devnull) as devnull:
        stdin, sys.stdin = sys.stdin, devnull
        try:
            with pytest.raises(UsageError, match="--yes"):
                cli._allowed_to_run(False)
            cli._allowed_to_run(True)
        finally:
            sys.stdin = stdin
