"""A job that runs torch.profiler itself (hostile review, 2026-12-05): Kineto holds one profiler
session per process, so doctor's window beside the job's took all its events (an empty
``key_averages()``) and, started inside a scheduled profiler's cycle, crashed the job in the
trace export (SIGSEGV, heap corruption). doctor now stays out of the way: no window beside a
profiler the job made, and an open window closes as the job makes one."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support import doctor_cmd

pytestmark = pytest.mark.e2e

AROUND = textwrap.dedent("""
    import time, torch
    from torch.profiler import profile, ProfilerActivity
    m = torch.nn.Linear(64, 64); opt = torch.optim.SGD(m.parameters(), lr=0.01)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(20):
            loss = m(torch.randn(32, 64)).pow(2).mean()
            opt.zero_grad(); loss.backward(); opt.step(); time.sleep(0.005)
    rows = prof.key_averages()
    print("addmm profiled", any("addmm" in r.key for r in rows), flush=True)
""")

INSIDE_THE_WINDOW = textwrap.dedent("""
    import os, sys, time, torch
    from torch.profiler import profile, ProfilerActivity, schedule
    m = torch.nn.Linear(64, 64); opt = torch.optim.SGD(m.parameters(), lr=0.01)
    def step():
        loss = m(torch.randn(32, 64)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step(); time.sleep(0.005)
    for i in range(10):  # doctor's window opens at step 8
        step()
    out = sys.argv[1]
    with profile(activities=[ProfilerActivity.CPU],
                 schedule=schedule(wait=1, warmup=1, active=4, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(out)) as prof:
        for i in range(12):
            step(); prof.step()
    print("trace written", os.path.getsize(out) > 1000, flush=True)
""")


def _job(tmp_path: Path, source: str) -> Path:
    path = tmp_path / "job.py"
    path.write_text(source)
    return path


def test_a_profiler_around_the_whole_loop_keeps_its_events(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = doctor_cmd("run", "--out", str(out), "--", sys.executable,
                        str(_job(tmp_path, AROUND)), timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("addmm profiled True"), result.stdout
    verdict = json.loads((out / "verdict.json").read_text())
    assert "its own torch.profiler" in verdict["probes"]["torch_ops"]["reason"]
    assert verdict["steps"]["count"] >= 15  # the steps are still measured


def test_a_profiler_made_inside_the_window_closes_it_and_runs(tmp_path: Path) -> None:
    out = tmp_path / "run"
    trace = tmp_path / "own_trace.json"
    result = doctor_cmd("run", "--out", str(out), "--", sys.executable,
                        str(_job(tmp_path, INSIDE_THE_WINDOW)), str(trace), timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("trace written True"), result.stdout
    assert "disableProfiler" not in result.stderr
