"""The DDP probe (doctor.probes.ddp) on a real DistributedDataParallel (gloo, one rank, in a
process of its own): its settings and buckets in meta.json, then in the run's ``ddp`` frame;
and the links probe (doctor.probes.links)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from doctor.store import layout
from doctor.store.reader import load_run
from tests.support import write_record

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch without distributed")

#: Run in a process of its own: gloo's threads outlive the process group, and other tests
#: count the communication threads of the test process.
JOB = """
import sys
from pathlib import Path
import torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from doctor.probes.ddp import DdpProbe
from doctor.record.session import WINDOW_END, Session

run_dir = Path(sys.argv[1])
dist.init_process_group("gloo", init_method=f"file://{run_dir.parent / 'store'}", rank=0,
                        world_size=1)
session = Session(run_dir, rank=0)
probe = DdpProbe(session)
assert probe.check().ok
probe.start()
model = DistributedDataParallel(
    nn.Sequential(nn.Linear(512, 512), nn.Linear(512, 512), nn.Linear(512, 10)),
    bucket_cap_mb=1)
for _ in range(3):
    model(torch.randn(4, 512)).sum().backward()
assert session.directory.is_dir()  # the job has recorded steps by now
session.emit(WINDOW_END)
session.close()
probe.stop()
assert DistributedDataParallel.__init__.__name__ == "__init__"  # given back
dist.destroy_process_group()
"""


def test_the_probe_records_each_ddp_modules_buckets(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-c", JOB, str(run_dir)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    [proc_dir] = [d for d, *_ in layout.process_dirs(run_dir)]
    [row] = json.loads((proc_dir / layout.META).read_text())["ddp"]
    params = 4 * (2 * (512 * 512 + 512) + 512 * 10 + 10)
    assert row["bucket_cap_bytes"] == 2**20
    assert row["parameter_bytes"] == params
    assert sum(row["bucket_bytes"]) == params  # (one rank: DDP keeps its first buckets)
    assert row["dtypes"] == ["float"] and row["backend"] == "gloo"
    write_record(run_dir)
    frame = load_run(run_dir).ddp
    assert len(frame) == 1
    assert frame["bucket_bytes"].iloc[0] == params
    assert frame["buckets"].iloc[0] == len(row["bucket_bytes"])
    assert frame["last_bucket_bytes"].iloc[0] == row["bucket_bytes"][-1]


