"""A second look when the run slows down (issue 34, item 3), end to end on CPU: the drift sample
job turns input-bound after some seconds (a real blocking read in ``__getitem__``); doctor opens a
later window, keeps its trace apart, and the verdict names each period's bottleneck. The
detector's constants are shrunk through DOCTOR_REWINDOW (no gap, a short stretch, a budget a
job of seconds can meet). ``--rewindow off`` keeps the one window."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from doctor.reports.periods import period_line
from doctor.verdict import Verdict
from tests.support import SAMPLE_JOBS, doctor_cmd

pytestmark = pytest.mark.e2e

QUICK = "gap=0,budget=0.5,sustain_min=32,sustain_fraction=0"
# by default 15 s of training, the input slow from 10 s on: after the first window's 8 s of
# stack sampling
JOB = [sys.executable, str(SAMPLE_JOBS / "drift.py")]


def drift_run(out: Path, *extra: str, job: tuple[str, ...] = ("--seconds", "15", "--slow-after",
                                                               "10", "--read-ms", "1.5")
              ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(the verdict, the job's own timing line, the training process's meta)."""
    result = doctor_cmd("run", "--quiet", "--out", str(out), *extra, "--", *JOB, *job,
                        timeout=240,
                        env={"DOCTOR_REWINDOW": QUICK, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    [job] = [json.loads(line) for line in result.stdout.splitlines() if '"job": "drift"' in line]
    [meta] = [json.loads(p.read_text()) for p in out.glob("rank-0/main-*/meta.json")]
    return json.loads((out / "verdict.json").read_text()), job, meta


def test_the_drift_opens_a_later_window_and_the_verdict_names_its_period(tmp_path: Path
                                                                         ) -> None:
    verdict, job, meta = drift_run(tmp_path / "run")
    later = meta["later_windows"]
    assert later and all(w["state"] == "done" for w in later)
    traces = sorted(p.name for p in tmp_path.glob("run/rank-0/main-*/trace*.json.gz"))
    assert traces == sorted(["trace.json.gz", *(f"trace-{w['window']}.json.gz" for w in later)])
    assert list(tmp_path.glob(f"run/rank-0/main-*/stacks-{later[-1]['window']}.txt"))
    periods = verdict["periods"]
    assert len(periods) == len(later) + 1
    assert periods[0]["bottleneck"] == "compute"
    # the input slowed down at the job's switch_step: a window opened after it, soon after
    last = periods[-1]
    # a blocking read: io, from the stacks sampled beside the later window
    assert last["bottleneck"] == "io" and last["bottleneck_share"] > 0.4
    assert job["switch_step"] < last["first_step"] < job["switch_step"] + 150
    line = period_line(Verdict.from_dict(verdict))  # periods that agree in a row are one
    assert line is not None and ": io, " in line.rsplit("; ", 1)[-1]
    assert line in (tmp_path / "run" / "report.html").read_text()


def test_rewindow_off_keeps_one_window(tmp_path: Path) -> None:
    verdict, job, meta = drift_run(tmp_path / "run", "--rewindow", "off",
                                   job=("--seconds", "5", "--slow-after", "2"))
    assert job["switch_step"]  # the job drifted ...
    assert "later_windows" not in meta  # ... and no later window opened
    assert [p.name for p in tmp_path.glob("run/rank-0/main-*/trace*")] == ["trace.json.gz"]
    assert "periods" not in verdict
