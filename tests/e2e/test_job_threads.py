"""The job's threads are its own (hostile review, 2026-12-05): doctor listened for a late
stack-sampler request on a thread of its own that lived 10 s in every job, so a job that joins
every thread it finds waited for it (4 s became 15 s) and ``threading.enumerate()`` listed it.
The listener now reads at the step boundaries."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from tests.support import doctor_cmd

pytestmark = pytest.mark.e2e

JOB = textwrap.dedent("""
    import threading, torch
    m = torch.nn.Linear(16, 16); opt = torch.optim.SGD(m.parameters(), lr=0.01)
    for i in range(30):  # past the window (steps 8-12)
        loss = m(torch.randn(8, 16)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
    print("threads", sorted(t.name for t in threading.enumerate()), flush=True)
""")


def test_no_doctor_thread_is_left_for_the_job_to_see_or_join(tmp_path: Path) -> None:
    job = tmp_path / "job.py"
    job.write_text(JOB)
    result = doctor_cmd("run", "--out", str(tmp_path / "run"), "--", sys.executable, str(job),
                        timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "threads ['MainThread']" in result.stdout, result.stdout
