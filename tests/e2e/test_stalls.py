"""A step many times the median (a hang) is named with its time and its share of the run,
wherever it falls: among the analysed steps, in the profiler window (whose steps the shares
leave out) or in the stack sampling span (whose steps count, less the sampler's pauses:
doctor.analyse.thread_time) (doctor.analyse.stalls).

The tests here start jobs, processes or real clocks (tests/e2e); the pure ones are in
tests/unit/test_stalls.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from doctor.analyse.stalls import ANALYSED, IN_WINDOW
from tests.support import doctor_cmd

JOB = """\
import sys, time
import torch
model = torch.nn.Linear(32, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
stalls = {int(s) for s in sys.argv[1].split(",")}
for step in range(1, int(sys.argv[2]) + 1):
    time.sleep(0.05)
    if step in stalls:
        time.sleep(1.5)
    model(torch.randn(8, 32)).sum().backward()
    opt.step(); opt.zero_grad()
"""


@pytest.mark.e2e
def test_long_steps_in_the_window_and_in_the_sampling_span_are_named_and_the_second_counts(
        tmp_path: Path) -> None:
    job = tmp_path / "stalls.py"
    job.write_text(JOB)
    out = tmp_path / "run"
    result = doctor_cmd("run", "--out", str(out), "--", sys.executable, str(job), "10,30",
                        "200", timeout=240, env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    verdict = json.loads((out / "verdict.json").read_text())
    stalls = {f["evidence"]["step"]: f["evidence"] for f in verdict["findings"]
              if f["id"] == "steps.stall"}
    assert {s["where"] for s in stalls.values()} == {IN_WINDOW, ANALYSED}, stalls
    assert all(s["seconds"] > 1.3 and 0 < s["share_of_run"] < 1 for s in stalls.values())
    notes = [n for n in verdict["notes"] if " took " in n and "median step" in n]
    assert len(notes) == 2
    assert sum("left out of the shares" in n for n in notes) == 1  # the window's
    assert sum("counts in the shares" in n for n in notes) == 1  # the sampling span's
    # the stall the stack samples cover names the call it waited in (a sleep, never compute)
    [sampled] = [s for s in stalls.values() if s["where"] == ANALYSED]
    top = sampled["extra_time_calls"][0]
    assert top["call"] == "stalls.py:9 in <module> -> time.sleep" and top["share"] > 0.8, sampled
