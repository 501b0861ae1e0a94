"""A job's traceback under doctor is the one it prints bare: doctor's wrappers (the DataLoader's
``__next__`` in the main process, ``fetch`` in a worker) are not in it, neither in the main
process's frames nor in the worker's "Original Traceback" (doctor.record.own_frames).

The tests here start jobs (tests/e2e); the pure ones are in tests/unit/test_own_frames.py.
"""

from __future__ import annotations

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
