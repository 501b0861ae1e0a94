from __future__ import annotations

import os
from pathlib import Path

import pytest

from doctor.probes.host import HostSampler
from doctor.store.samples import read_host
from tests.support import TickClock


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
