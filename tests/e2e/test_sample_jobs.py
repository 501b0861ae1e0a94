"""The input-stage sample jobs run, with and without the switch that removes their bottleneck, and
end with the JSON line of ``StepTimer.report``; every sample job's ``--ablate`` flips its switch
in one process and reports both sides. Tiny sizes: this checks that they work, not how fast they
are (bench/accuracy.py does that), except for one exaggerated bottleneck."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import SAMPLE_JOBS, run_together

sys.path.insert(0, str(SAMPLE_JOBS))

pytestmark = pytest.mark.e2e

JOBS = {
    "io_bound": ("--cached", ["--files", "2", "--file-mb", "0.25", "--batch", "2"]),
    "decode_bound": ("--predecoded", ["--images", "2", "--size", "64", "--batch", "2"]),
    "preprocess_bound": ("--pretransformed", ["--images", "2", "--batch", "2", "--passes", "1"]),
    "collate_bound": ("--fast-collate", ["--sequences", "4", "--max-len", "32", "--batch", "2"]),
}


CASES = [(job, switch) for job in sorted(JOBS) for switch in (False, True)]
ABLATED = {**{job: small for job, (_flag, small) in JOBS.items()},
           "input_bound": ["--batch", "2", "--work", "400", "--hidden", "16"],  # exaggerated
           "get_batch_bound": ["--batch", "2", "--block", "16"],
           "pil_transforms": ["--images", "2", "--size", "64", "--batch", "2"],  # in memory
           "http_loader": ["--batch", "2", "--item-kb", "4", "--hidden", "16", "--workers", "1"],
           "compute_bound": ["--width", "64", "--batch", "8"]}
SWITCHED_AFTER = ("input_bound", "get_batch_bound")  # they size their data by the blocks
Finished = dict[tuple[str, bool | str], tuple[subprocess.CompletedProcess[str], Path]]


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Finished:
    """Every case, started together (each is mostly torch's import time) and waited for."""
    commands: dict[tuple[str, bool | str], list[str]] = {}
    data: dict[tuple[str, bool | str], Path] = {}
    for job, small in ABLATED.items():
        data[job, "ablated"] = tmp_path_factory.mktemp(f"{job}-ablated")
        commands[job, "ablated"] = [
            sys.executable, str(SAMPLE_JOBS / f"{job}.py"), "--steps", "16", "--ablate", "8",
            *(["--data", str(data[job, "ablated"])] if job in JOBS else []), *small]
    for job in SWITCHED_AFTER:
        data[job, "switch-after"] = tmp_path_factory.mktemp(job)
        commands[job, "switch-after"] = [sys.executable, str(SAMPLE_JOBS / f"{job}.py"),
                                         "--steps", "16", "--switch-after", "10", *ABLATED[job]]
    for job, (flag, small) in JOBS.items():  # the bottleneck side: the ablated run's first
        data[job, True] = tmp_path_factory.mktemp(f"{job}-switched")  # blocks (a process less)
        commands[job, True] = [sys.executable, str(SAMPLE_JOBS / f"{job}.py"), "--steps", "3",
                               "--data", str(data[job, True]), *small, flag]
    done = run_together(commands, timeout=180)
    return {key: (done[key], data[key]) for key in commands}


@pytest.mark.parametrize(("job", "switch"), CASES,
                         ids=[f"{j}-{'switched' if s else 'bottleneck'}" for j, s in CASES])
def test_sample_job_runs_and_reports(finished: Finished, job: str, switch: bool) -> None:
    """Switched: its flag, alone, for 3 steps; the bottleneck: the ablated run, whose first
    block is the job without its switch (the same code as without ``--ablate``)."""
    proc, data = finished[job, switch or "ablated"]
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["job"] == job
    assert report["steps"] == (3 if switch else 10)
    assert report["median_step_s"] > 0
    assert report["workers"] == 0
    assert any(data.iterdir()), "the job generates its data into --data"


def last_report(finished: Finished, key: tuple[str, bool | str]) -> dict[str, Any]:
    """The JSON line a finished job ended with, once it exited 0."""
    proc, _data = finished[key]
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("job", sorted(ABLATED))
def test_ablation_reports_both_sides_from_one_process(finished: Finished, job: str) -> None:
    report = last_report(finished, (job, "ablated"))
    assert report["ablation_block"] == 8
    assert report["steps"] == 10  # two blocks a side, the first 3 steps of each not counted
    assert report["median_step_s"] > 0
    assert report["switched_median_step_s"] > 0
    if job != "compute_bound":  # the input jobs time the training part of their steps
        assert 0 < report["train_median_s"] <= report["median_step_s"]
        assert report["switched_train_median_s"] > 0


@pytest.mark.parametrize("run", ["ablated", "switch-after"])
def test_the_switch_takes_the_bottleneck_away(finished: Finished, run: str) -> None:
    """input_bound with 400 inner steps per feature and a 16-wide model: its switch (samples
    built once) takes most of the step away, whether the sides alternate or follow each other."""
    report = last_report(finished, ("input_bound", run))
    assert report["switched_median_step_s"] < 0.5 * report["median_step_s"]


@pytest.mark.parametrize("job", SWITCHED_AFTER)
def test_switch_after_runs_both_sides_in_turn(finished: Finished, job: str) -> None:
    report = last_report(finished, (job, "switch-after"))
    assert report["steps"] == 10  # 10 then 6 steps, the first 3 of each not counted
    assert report["switched_median_step_s"] > 0


