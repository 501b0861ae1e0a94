"""Under torchrun, a rank's slow step that waited at the all-reduce for another rank's slow
step is named a wait for that rank (doctor.analyse.peer_waits); the rank that ran long is
not said to have waited.

The tests here start jobs (tests/e2e); the pure ones are in tests/unit/test_peer_waits.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support import doctor_cmd

JOB = """\
import time
import torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
model = DistributedDataParallel(nn.Linear(64, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(1, 61):
    time.sleep(0.04)
    if rank == 1 and step in (35, 50):
        end = time.perf_counter() + 1.5
        while time.perf_counter() < end:  # rank 1's own work: on a core, not waiting
            pass
    model(torch.randn(16, 64)).sum().backward()
    opt.step(); opt.zero_grad()
dist.destroy_process_group()
"""


@pytest.mark.e2e
@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not on PATH")
def test_a_rank_that_waited_for_a_straggler_is_named_a_peer_wait(tmp_path: Path) -> None:
    job = tmp_path / "straggler.py"
    job.write_text(JOB)
    out = tmp_path / "run"
    result = doctor_cmd("run", "--out", str(out), "--", "torchrun", "--nproc-per-node", "2",
                        str(job), timeout=240, env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    verdict = json.loads((out / "verdict.json").read_text())
    slow = {(s["rank"], s["step"]): s for s in verdict["slow_steps"]["steps"]}
    waited = [s for (rank, _), s in slow.items() if rank == 0 and s["cause"] == "peer"]
    assert len(waited) >= 1, slow
    assert all(s["what"][0].startswith("rank 1, step ") for s in waited)
    assert not any(s["cause"] == "peer" for (rank, _), s in slow.items() if rank == 1)
    peer = next(f for f in verdict["findings"] if f["id"] == "steps.peer")
    assert "Even out the work of rank 1" in peer["fixes"][0]["title"]
