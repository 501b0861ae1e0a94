"""Which process of a rank is analysed as the job: the one that ran training steps, never a
larger helper that recorded none, nor a daemon child that outlived the job; and a note says so
when several processes recorded steps."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from doctor.analyse.steps import choice_notes, training_processes
from doctor.record.session import Session
from doctor.store.reader import load_run
from tests.support import FakeClock, doctor_cmd, write_record

TRAIN = """
    model = torch.nn.Linear(32, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(STEPS):
        opt.zero_grad()
        model(torch.randn(16, 32)).pow(2).mean().backward()
        opt.step()
"""

#: The job trains 20 steps while a helper child, started with subprocess, computes more and for
#: longer than the job, and records no step.
HELPER_JOB = textwrap.dedent("""
    import subprocess, sys
    import torch
    HELPER = '''
    import torch
    x = torch.randn(192, 192)
    for _ in range(1500):
        x = torch.tanh(x @ x.T / 192)
    print("helper done", flush=True)
    '''
    helper = subprocess.Popen([sys.executable, "-c", HELPER])
    STEPS = 20
""") + textwrap.dedent(TRAIN) + textwrap.dedent("""
    helper.wait()
    print("job done", flush=True)
""")

#: The job trains 20 steps and starts a daemon child (a session of its own) that trains 150
#: steps, then outlives the job; it prints the daemon's pid for the test to end it.
DAEMON_JOB = textwrap.dedent("""
    import subprocess, sys
    import torch
    DAEMON = '''
    import time
    import torch
    STEPS = 150
    ''' + {train!r} + '''
    time.sleep(60)
    '''
    daemon = subprocess.Popen([sys.executable, "-c", DAEMON], start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(daemon.pid, flush=True)
    STEPS = 20
""").replace("{train!r}", repr(textwrap.dedent(TRAIN))) + textwrap.dedent(TRAIN) + textwrap.dedent(
    """
    import time
    time.sleep(8)  # the daemon has trained by now, and runs on
    """)


def run(tmp_path: Path, script: str) -> subprocess.CompletedProcess[str]:
    job = tmp_path / "job.py"
    job.write_text(script)
    return doctor_cmd("run", "--out", str(tmp_path / "run"), "--", sys.executable, str(job),
                      cwd=tmp_path, timeout=300)


def verdict_of(tmp_path: Path, result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.returncode == 0, result.stderr
    return dict(json.loads((tmp_path / "run" / "verdict.json").read_text()))


@pytest.mark.e2e
def test_a_larger_helper_child_without_steps_is_not_the_job(tmp_path: Path) -> None:
    result = run(tmp_path, HELPER_JOB)
    verdict = verdict_of(tmp_path, result)
    assert "helper done" in result.stdout and "job done" in result.stdout
    assert verdict["steps"]["count"] == 19  # the job's 20 optimizer steps
    assert not [n for n in verdict["notes"] if "processes recorded steps" in n]


@pytest.mark.e2e
def test_a_daemon_child_that_outlives_the_job_is_not_the_job(tmp_path: Path) -> None:
    result = run(tmp_path, DAEMON_JOB)
    try:
        os.killpg(int(result.stdout.split()[0]), signal.SIGKILL)
    except (IndexError, ValueError, ProcessLookupError):
        pass
    verdict = verdict_of(tmp_path, result)
    assert verdict["steps"]["count"] == 19  # the job's, not the daemon's 149
    [note] = [n for n in verdict["notes"] if "processes recorded steps" in n]
    assert "2 processes recorded steps" in note
    assert "(19 optimizer steps)" in note
    assert "(149 optimizer steps, no exit recorded: it outlived the job" in note


def record_steps(run_dir: Path, pid: int, steps: int, *, ends: bool) -> None:
    """``steps`` optimizer steps of process ``pid``; ``ends``: its Session closes (an exit)."""
    clock = FakeClock()
    session = Session(run_dir, rank=0, clock=clock, window_start=10**9)
    session.pid = pid
    for _ in range(steps):
        session.record_optimizer_start()
        clock.tick(0.01)
        session.record_optimizer_end(0)
    if ends:
        session.close()


@pytest.mark.parametrize("signal_, analysed", [(None, 222), (15, 111)])
def test_one_without_an_exit_comes_after_one_that_ended_unless_the_job_was_killed(
        tmp_path: Path, signal_: int | None, analysed: int) -> None:
    record_steps(tmp_path, 111, 20, ends=False)  # outlived the job, or killed with it
    record_steps(tmp_path, 222, 10, ends=True)
    write_record(tmp_path, exit_code=0 if signal_ is None else 128 + signal_, signal=signal_)
    run = load_run(tmp_path)
    assert training_processes(run)[0].pid == analysed
    [note] = choice_notes(run)
    assert note.startswith(f"Rank 0: 2 processes recorded steps; the analysis is of pid {analysed}")
    assert ("no exit recorded" in note) is (signal_ is None)
