"""A process of the job killed by a signal is named first, with the signal and (where the
kernel's count says so) the OOM killer; its peers' broken connections follow from it
(doctor.probes.exits, doctor.analyse.failures).

The tests here start jobs, processes or real clocks (tests/e2e); the pure ones are in
tests/unit/test_failures.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from doctor.probes import exits
from doctor.probes.exits import ExitWatcher
from tests.support import doctor_cmd

KILLED_RANK = """\
import os, signal, time
import torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
model = DistributedDataParallel(nn.Linear(64, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(1, 400):
    if rank == 1 and step == 8:
        os.kill(os.getpid(), signal.SIGKILL)
    loss = model(torch.randn(16, 64)).sum()
    opt.zero_grad(); loss.backward(); opt.step()
    time.sleep(0.02)
dist.destroy_process_group()
"""


KILLED_WORKER = """\
import os, signal, time
import torch
from torch.utils.data import DataLoader, Dataset

class Data(Dataset):
    started = None  # set in each worker by its first item
    def __len__(self):
        return 100000
    def __getitem__(self, i):
        if Data.started is None:
            Data.started = time.monotonic()
        if torch.utils.data.get_worker_info().id == 1 and time.monotonic() - Data.started > 5:
            # after the parent's rescans (every 2 s) have found it, however loaded the machine
            # (a worker that dies within a second of its start may not be)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.005)
        return torch.randn(8)

model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x in DataLoader(Data(), batch_size=8, num_workers=2):
    model(x).sum().backward(); opt.step(); opt.zero_grad()
"""


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfd on this platform")
def test_the_watcher_reads_a_killed_process_before_it_is_reaped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    counter = tmp_path / "vmstat"
    counter.write_text("oom_kill 4\n")
    monkeypatch.setattr(exits, "oom_kill_counters", lambda _pid: [counter])
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    watcher = ExitWatcher(os.getpid(), time.monotonic())
    try:
        watcher.watch([child.pid])
        counter.write_text("oom_kill 5\n")  # the kernel's count rose: the OOM killer's kill
        child.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 30
        while not watcher.exits and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        watcher.stop()
        child.wait()  # reaped only now, as torchrun would
    assert [(e.pid, e.signal_name, e.oom_killer) for e in watcher.exits] == [
        (child.pid, "SIGKILL", True)]


@pytest.mark.e2e
@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not on PATH")
def test_a_rank_killed_by_sigkill_is_named_before_its_peers_connection_error(
        tmp_path: Path) -> None:
    job = tmp_path / "killed_rank.py"
    job.write_text(KILLED_RANK)
    out = tmp_path / "run"
    result = doctor_cmd("run", "--out", str(out), "--", "torchrun", "--nproc-per-node", "2",
                        str(job), timeout=240, env={"OMP_NUM_THREADS": "1"})
    assert result.returncode != 0, result.stderr[-3000:]
    verdict = json.loads((out / "verdict.json").read_text())
    first = verdict["findings"][0]
    assert first["id"] == "failure.killed"
    assert first["evidence"]["rank"] == 1 and first["evidence"]["signal"] == "SIGKILL"
    assert "SIGKILL" in first["title"]
    failures = [n for n in verdict["notes"] if "killed" in n or "failed" in n]
    assert failures[0].startswith("Rank 1 (pid ") and "SIGKILL" in failures[0]
    later = [n for n in failures[1:] if "Connection reset" in n or "Rank 0 failed" in n]
    assert all("after rank 1" in n for n in later)


@pytest.mark.e2e
def test_a_dataloader_worker_killed_by_sigkill_is_named_before_its_rank_s_error(
        tmp_path: Path) -> None:
    job = tmp_path / "killed_worker.py"
    job.write_text(KILLED_WORKER)
    out = tmp_path / "run"
    result = doctor_cmd("run", "--out", str(out), "--", sys.executable, str(job), timeout=240,
                        env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 1, result.stderr[-3000:]
    verdict = json.loads((out / "verdict.json").read_text())
    first = verdict["findings"][0]
    assert first["id"] == "failure.killed", verdict["notes"]
    assert first["evidence"]["role"] == "worker1" and first["evidence"]["signal"] == "SIGKILL"
    failures = [n for n in verdict["notes"] if "killed" in n or "failed" in n]
    assert failures[0].startswith("DataLoader worker 1 of rank 0 (pid ")
    assert "Rank 0 failed (after DataLoader worker 1" in failures[1]


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfd here: no watching thread")
def test_the_exit_watcher_sleeps_until_a_process_ends_or_it_is_stopped() -> None:
    """No periodic wake-ups while the job runs (each one is taken from the job's cores): over a
    second with a process watched, the thread switches out a handful of times, where polling
    every 200 ms made it 5 or more; a later-watched process ending is still seen, and stop()
    ends the thread."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    watcher = ExitWatcher(os.getpid(), time.monotonic())
    try:
        watcher.watch([child.pid])
        assert watcher._thread is not None
        status = Path(f"/proc/self/task/{watcher._thread.native_id}/status")

        def switches() -> int:
            line = next(x for x in status.read_text().splitlines()
                        if x.startswith("voluntary_ctxt_switches"))
            return int(line.split()[1])

        time.sleep(0.2)
        before = switches()
        time.sleep(1.0)
        assert switches() - before <= 2
        child.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 30
        while not watcher.exits and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [e.pid for e in watcher.exits] == [child.pid]
    finally:
        watcher.stop()
        child.wait()
    assert not watcher._thread.is_alive()
