from __future__ import annotations

import os
from pathlib import Path

import pytest

from doctor.probes.host import HostSampler
from doctor.store.samples import read_host


class TickClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_samples_this_process_and_the_machine(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    clock = TickClock()
    sampler = HostSampler(os.getpid(), clock=clock, proc_stat=stat, run_dir=tmp_path)
    assert sampler.check().ok
    sampler.start()
    for i in range(4):
        # per tick: 60 jiffies user, 20 idle, 20 iowait on a machine of `cores` cores
        stat.write_text(f"cpu  {60 * i} 0 0 {20 * i} {20 * i} 0 0 0\n"
                        "procs_running 7\nprocs_blocked 0\n")
        clock.now += 0.5
        sampler.sample()
    sampler.stop()
    procs, system = read_host(tmp_path)
    assert set(procs["pid"]) == {os.getpid()}
    assert list(procs["t_s"]) == [0.5, 1.0, 1.5, 2.0]
    assert procs["cpu_pct"].iloc[1:].notna().all()
    assert (system["runnable"] == 7).all()
    assert len(system) == 3  # the first tick only primes the CPU counters
    cores = system["cores"].iloc[0]
    assert system["busy_cores"].tolist() == pytest.approx([0.6 * cores] * 3)
    assert system["iowait_cores"].tolist() == pytest.approx([0.2 * cores] * 3)


def test_a_process_that_is_gone_is_reported(tmp_path: Path) -> None:
    status = HostSampler(2**22 + 12345).check()
    assert not status.ok
    assert "cannot read" in status.reason


def test_missing_samples_load_as_empty_frames(tmp_path: Path) -> None:
    procs, system = read_host(tmp_path / "none")
    assert procs.empty and system.empty
    assert "cpu_pct" in procs.columns and "runnable" in system.columns


def test_rows_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import doctor.probes.host as host

    monkeypatch.setattr(host, "MAX_ROWS", 10)
    clock = TickClock()
    sampler = HostSampler(os.getpid(), clock=clock, run_dir=tmp_path)
    for _ in range(50):
        clock.now += 1
        sampler.sample()
    sampler.stop()
    procs, system = read_host(tmp_path)
    assert len(procs) <= 11 and len(system) <= 11


def test_the_answer_stays_once_the_job_is_gone(tmp_path: Path) -> None:
    import subprocess
    import sys

    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    sampler = HostSampler(job.pid, run_dir=tmp_path)
    assert sampler.check().ok
    job.kill()
    job.wait()
    assert sampler.check().ok  # doctor run asks again for the report, after the job exited


def test_a_childs_own_memory_is_read_as_it_appears_then_every_few_seconds(tmp_path: Path
                                                                          ) -> None:
    import subprocess
    import sys

    import doctor.probes.host as host

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        clock = TickClock()
        sampler = HostSampler(os.getpid(), clock=clock, run_dir=tmp_path, rescan_s=0.0)
        sampler.start()
        for _ in range(12):  # 6 s at 2 Hz
            clock.now += 0.5
            sampler.sample()
        sampler.stop()
    finally:
        child.kill()
        child.wait()
    procs, _ = read_host(tmp_path)
    mine = procs[procs["pid"] == child.pid]
    read = mine[mine["private_bytes"].notna()]
    # read at its first tick (its baseline), then once PRIVATE_MIN_S have passed each time
    assert read["t_s"].iloc[0] == mine["t_s"].iloc[0]
    assert 2 <= len(read) <= 1 + 6 / host.PRIVATE_MIN_S
    assert (read["private_bytes"] > 0).all()
    # the job's own first process (here: the test) is never read: nothing forked it
    assert procs.loc[procs["pid"] == os.getpid(), "private_bytes"].isna().all()


def test_communication_threads_by_name_and_their_cpu() -> None:
    import time

    from doctor.probes.host import comm_threads, threads_cpu_s

    pid = os.getpid()
    own = Path(f"/proc/{pid}/comm").read_bytes().strip()
    assert pid in comm_threads(pid, (own,))  # the main thread, by its own name
    assert comm_threads(pid) == []  # no gloo or NCCL thread in a test process
    t0 = threads_cpu_s(pid, [pid])
    deadline = time.thread_time() + 0.1
    while time.thread_time() < deadline:
        pass
    assert threads_cpu_s(pid, [pid]) > t0
    assert threads_cpu_s(pid, []) != threads_cpu_s(pid, [])  # NaN: no such threads
