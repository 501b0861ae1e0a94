"""``doctor try`` runs nothing it was not allowed to: without a terminal and without ``--yes`` it
prints the plan and exits 2 (the job never starts: the file it would write is absent); what a
received run.json holds is shown escaped (no control character reaches the terminal); and of its
environment only the job-shaping names doctor records are put back.

The tests here run no job, process nor clock (tests/unit); those that do are in
tests/e2e/test_try_safety.py.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from doctor.store.rundir import write_run_record
from doctor.tries.attempt import recorded_job, restorable
from tests.support import ROOT


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
