"""The job as a run recorded it, ready for doctor try: argv, cwd, and its environment put back."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from doctor.errors import UsageError
from doctor.job_record import recorded_env, run_record
from doctor.store.rundir import write_run_record
from doctor.tries.attempt import recorded_job


def test_run_json_keeps_the_jobs_environment_but_not_doctors_or_secrets() -> None:
    env = {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "0", "HOME": "/root",
           "NCCL_API_KEY": "s3cret", "DOCTOR_RUN_DIR": "/x", "PYTHONPATH": "/boot:/mine"}
    assert recorded_env(env) == {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "0",
                                 "PYTHONPATH": "/boot:/mine"}
    record = run_record(["python", "t.py"], "t", 0.0, 0.0, cwd="/work", env=env)
    assert record["cwd"] == "/work"
    assert "DOCTOR_RUN_DIR" not in record["env"] and "NCCL_API_KEY" not in record["env"]


def test_the_recorded_environment_is_put_back(tmp_path: Path) -> None:
    write_run_record(tmp_path, {"argv": ["python", "train.py"], "name": "train",
                                "cwd": "/somewhere", "env": {"OMP_NUM_THREADS": "1"}})
    job = recorded_job(tmp_path, now={"OMP_NUM_THREADS": "8", "CUDA_VISIBLE_DEVICES": "3",
                                      "HOME": "/root"})
    assert job.argv == ["python", "train.py"] and job.cwd == "/somewhere"
    assert job.env == {"OMP_NUM_THREADS": "1", "HOME": "/root"}
    assert len(job.notes) == 2  # both differences are said


def test_a_watch_run_reruns_its_script_and_a_notebook_is_refused(tmp_path: Path) -> None:
    write_run_record(tmp_path, {"argv": ["train.py", "--lr", "1"], "name": "train",
                                "mode": "watch", "env": {}})
    assert recorded_job(tmp_path, now={}).argv == [sys.executable, "train.py", "--lr", "1"]
    write_run_record(tmp_path, {"argv": ["-c"], "name": "x", "mode": "watch", "env": {}})
    with pytest.raises(UsageError, match="not started from a script"):
        recorded_job(tmp_path, now={})


