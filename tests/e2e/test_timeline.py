"""The run's timeline (timeline.json.gz, doctor export): the Chrome-trace format, every step once,
bounded detail, and the profiler window's events on the rings' clock.

The tests here start jobs, processes or real clocks (tests/e2e); the pure ones are in
tests/unit/test_timeline.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from doctor.analyse.timeline import INTERVAL_CAP
from doctor.outputs import export_timeline
from tests import chrome_trace
from tests.support import doctor_cmd, record_loop, write_record

MB = 2**20


def test_export_writes_a_run_recorded_before(tmp_path: Path) -> None:
    run = tmp_path / "run"
    record_loop(run, 30)
    write_record(run)
    assert not (run / "timeline.json.gz").exists()
    result = doctor_cmd("export", str(run), "-o", str(tmp_path / "t.json"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tmp_path / "t.json")
    events = chrome_trace.check(json.loads((tmp_path / "t.json").read_text()))
    assert chrome_trace.slices_by_thread(events)["steps"] == 29
    assert export_timeline(run) == run / "timeline.json.gz"


def test_export_of_a_missing_run_is_one_line(tmp_path: Path) -> None:
    result = doctor_cmd("export", str(tmp_path / "nope"))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "no such run directory" in result.stderr


LONG_JOB = """
import torch
from torch.utils.data import DataLoader, TensorDataset

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = TensorDataset(torch.randn(20_000, 4), torch.randn(20_000, 1))
for x, y in DataLoader(data, batch_size=1):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
print("done")
"""


@pytest.mark.e2e
def test_a_job_of_20000_steps_has_a_timeline_of_a_few_mb(tmp_path: Path) -> None:
    job = tmp_path / "long.py"
    job.write_text(LONG_JOB)
    out = tmp_path / "run"
    result = doctor_cmd("run", "--quiet", "--out", str(out), "python", str(job), timeout=300)
    assert result.returncode == 0 and result.stdout == "done\n", result.stderr[-2000:]
    path = out / "timeline.json.gz"
    data = chrome_trace.load(path)
    events = chrome_trace.check(data)
    steps = [e["name"] for e in events if e["ph"] == "X" and e["cat"] == "step"]
    assert len(steps) == len(set(steps)) >= 19_990  # every step, once
    assert chrome_trace.slices_by_thread(events)["training thread"] == INTERVAL_CAP
    assert data["otherData"]["capped"] and path.stat().st_size < 5 * MB
    assert not [line for line in result.stderr.splitlines()
                if line.startswith("doctor: recording")]  # --quiet
