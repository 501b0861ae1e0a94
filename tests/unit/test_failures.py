"""A process of the job killed by a signal is named first, with the signal and (where the
kernel's count says so) the OOM killer; its peers' broken connections follow from it
(doctor.probes.exits, doctor.analyse.failures)."""

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
from doctor.probes.exits import ExitWatcher, decode, read_exit, read_oom_kills
from tests.conftest import doctor_cmd

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
    def __len__(self):
        return 100000
    def __getitem__(self, i):
        if torch.utils.data.get_worker_info().id == 1 and i > 1600:  # after the parent's
            # rescans have found it (a worker that dies within a second of its start may not be)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.005)
        return torch.randn(8)

model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x in DataLoader(Data(), batch_size=8, num_workers=2):
    model(x).sum().backward(); opt.step(); opt.zero_grad()
"""


def test_a_wait_status_decodes_to_the_signal_or_the_exit_status() -> None:
    killed = decode(5, 1, signal.SIGKILL, 2.0, oom_killer=True)
    assert killed is not None and killed.signal_name == "SIGKILL" and killed.oom_killer
    assert decode(5, 1, signal.SIGSEGV | 0x80, 2.0, None).core_dumped  # type: ignore[union-attr]
    assert decode(5, 1, 3 << 8, 2.0, None).exit_status == 3  # type: ignore[union-attr]
    assert decode(5, 1, 0, 2.0, None) is None  # a clean exit is not a failure
    term = decode(5, 1, signal.SIGTERM, 2.0, oom_killer=True)
    assert term is not None and term.oom_killer is None  # the OOM killer sends SIGKILL only


def test_a_zombie_stat_gives_its_wait_status(tmp_path: Path) -> None:
    rest = " ".join(["0"] * 47)  # fields 5-51
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "stat").write_text(f"7 (a (b) c) Z 3 {rest} 9\n")  # field 52: 9
    assert read_exit(7, tmp_path) == (9, 3)
    (tmp_path / "8").mkdir()
    (tmp_path / "8" / "stat").write_text(f"8 (python) S 3 {rest} 0\n")
    assert read_exit(8, tmp_path) is None  # alive: no status yet
    assert read_exit(9, tmp_path) is None


def test_the_oom_kill_count_is_read_from_a_cgroup_or_vmstat(tmp_path: Path) -> None:
    events = tmp_path / "memory.events"
    events.write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\noom_group_kill 0\n")
    assert read_oom_kills(events) == 2
    assert read_oom_kills(tmp_path / "none") is None


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


def test_odd_deaths_in_run_json_are_left_out(tmp_path: Path) -> None:
    from doctor.analyse.failures import failure_notes
    from doctor.store.reader import load_run

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({
        "schema": "doctor.run/2", "argv": ["python", "x.py"], "exit_code": 1,
        "t0_monotonic_s": 1.0,
        "deaths": [{"pid": "x", "signal": 9}, {"pid": 5, "signal": "KILL"}, "text",
                   {"pid": 6, "signal": 9, "t_s": "soon", "oom_killer": "yes"}]}))
    notes = failure_notes(load_run([run_dir]))
    assert notes == ["Process 6 of the job was killed by SIGKILL; it failed first: the other "
                     "processes' errors follow from it (a peer's connection reset or closed, a "
                     "DataLoader worker that exited unexpectedly)."]


def _run_dir(tmp_path: Path, exit_code: int, deaths: list[dict[str, object]],
             metas: dict[str, dict[str, object]]) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({
        "schema": "doctor.run/2", "argv": ["torchrun", "x.py"], "exit_code": exit_code,
        "t0_monotonic_s": 1.0, "deaths": deaths}))
    for folder, meta in metas.items():
        (run_dir / folder).mkdir(parents=True)
        (run_dir / folder / "meta.json").write_text(json.dumps(meta))
    return run_dir


def test_a_helper_the_job_stopped_itself_is_no_failure(tmp_path: Path) -> None:
    from doctor.analyse.failures import failure_finding, failure_notes
    from doctor.store.reader import load_run

    run_dir = _run_dir(tmp_path, 0, [{"pid": 300, "ppid": 100, "signal": 9, "t_s": 5.0},
                                     {"pid": 301, "ppid": 100, "signal": 15, "t_s": 6.0}],
                       {"rank-0/main-100": {"pid": 100, "rank": 0, "role": "main",
                                            "ended_ns": 9}})
    run = load_run([run_dir])
    assert failure_notes(run) == [] and failure_finding(run) is None


def test_a_rank_that_left_no_exit_record_is_named_where_its_signal_was_missed(
        tmp_path: Path) -> None:
    from doctor.analyse.failures import failure_notes
    from doctor.store.reader import load_run

    run_dir = _run_dir(tmp_path, 1, [], {
        "rank-0/main-100": {"pid": 100, "rank": 0, "role": "main", "ended_ns": 9},
        "rank-1/main-101": {"pid": 101, "rank": 1, "role": "main"}})
    notes = failure_notes(load_run([run_dir]))
    assert notes[0].startswith("Rank 1 ended without a clean exit and without a Python "
                               "exception: it was killed")


def test_a_worker_reaped_before_the_parent_read_it_is_named_from_torchs_error(
        tmp_path: Path) -> None:
    """The training process reaps its DataLoader workers within milliseconds: where the parent
    lost that race, torch's own error names the worker's pid and signal."""
    from doctor.analyse.failures import failure_finding, failure_notes
    from doctor.store.reader import load_run

    crashed = ("RuntimeError: DataLoader worker (pid 102) is killed by signal: Killed. ")
    run_dir = _run_dir(tmp_path, 1, [], {
        "rank-0/main-100": {"pid": 100, "rank": 0, "role": "main", "crashed": crashed,
                            "crashed_ns": 5},
        "rank-0/worker1-102": {"pid": 102, "rank": 0, "role": "worker1"}})
    run = load_run([run_dir])
    finding = failure_finding(run)
    assert finding is not None and finding.evidence["signal"] == "SIGKILL"
    assert finding.evidence["role"] == "worker1"
    notes = failure_notes(run)
    assert notes[0].startswith("DataLoader worker 1 of rank 0 (pid 102) was killed by SIGKILL")
