"""A job's traceback under doctor is the one it prints bare: doctor's wrappers (the DataLoader's
``__next__`` in the main process, ``fetch`` in a worker) are not in it, neither in the main
process's frames nor in the worker's "Original Traceback" (doctor.record.own_frames).

The tests here start jobs (tests/e2e); the pure ones are in tests/unit/test_own_frames.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import doctor_cmd

JOB = """\
import torch
from torch.utils.data import DataLoader, Dataset
class Samples(Dataset):
    def __len__(self):
        return 100
    def __getitem__(self, i):
        if i == 40:
            raise ValueError("a bad sample")
        return torch.randn(4)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x in DataLoader(Samples(), batch_size=4, num_workers=1):
    model(x).sum().backward(); opt.step(); opt.zero_grad()
"""


def frames(stderr: str) -> list[str]:
    return [line.strip() for line in stderr.splitlines() if line.strip().startswith("File ")]


@pytest.mark.e2e
def test_the_jobs_traceback_holds_no_frame_of_doctors(tmp_path: Path) -> None:
    job = tmp_path / "bad_sample.py"
    job.write_text(JOB)
    bare = subprocess.run([sys.executable, str(job)], capture_output=True, text=True,
                          timeout=120)
    under = doctor_cmd("run", "--out", str(tmp_path / "run"), "--", sys.executable, str(job),
                       timeout=180)
    assert bare.returncode == under.returncode == 1
    assert "Original Traceback" in bare.stderr and "Original Traceback" in under.stderr
    assert frames(under.stderr) == frames(bare.stderr), under.stderr[-3000:]


THREADED = """\
import threading, torch
def train(seed):
    torch.manual_seed(seed)
    model = torch.nn.Linear(32, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(40):
        model(torch.randn(8, 32)).sum().backward(); opt.step(); opt.zero_grad()
threads = [threading.Thread(target=train, args=(s,)) for s in (1, 2)]
[t.start() for t in threads]; [t.join() for t in threads]
print("trained")
"""


@pytest.mark.e2e
def test_a_job_training_in_threads_prints_what_it_prints_bare(tmp_path: Path) -> None:
    """torch imported in the main thread, the steps in two others: a window there would make
    Kineto print 'ERROR: External init callback must run in same thread as registerClient'
    into the job's stderr; none opens, and the probes say why."""
    job = tmp_path / "threads.py"
    job.write_text(THREADED)
    out = tmp_path / "run"
    under = doctor_cmd("run", "--out", str(out), "--", sys.executable, str(job), timeout=180)
    assert under.returncode == 0, under.stderr[-2000:]
    job_lines = [ln for ln in under.stderr.splitlines() if not ln.startswith("doctor")]
    assert not any("registerClient" in ln for ln in job_lines), under.stderr[-2000:]
    assert under.stdout.startswith("trained")
    verdict = json.loads((out / "verdict.json").read_text())
    assert "no window opens" in verdict["probes"]["torch_ops"].get("reason", ""), verdict["probes"]
