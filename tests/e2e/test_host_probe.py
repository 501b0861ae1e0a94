from __future__ import annotations

import os
from pathlib import Path

from doctor.probes.host import HostSampler
from doctor.store.samples import read_host
from tests.support import TickClock


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


def test_the_parent_finds_the_file_a_jobs_child_reads_and_its_mount(tmp_path: Path) -> None:
    """The job's worker (a child of the job) holds a data file open for reading: the parent's
    scan finds it, on the mount the job's table puts it, with the folder's size; a probe that
    samples its own process (doctor.watch) scans nothing."""
    import subprocess
    import sys
    import time

    import psutil

    from doctor.store.data_files import read_mounts, read_scans

    data = tmp_path / "dataset"
    data.mkdir()
    for i in range(4):
        (data / f"{i}.bin").write_bytes(b"x" * 2048)
    worker = tmp_path / "worker.py"
    worker.write_text(f"import time\nf = open({str(data / '0.bin')!r}, 'rb')\ntime.sleep(60)\n")
    code = ("import subprocess, sys, time\n"
            f"child = subprocess.Popen([sys.executable, {str(worker)!r}])\ntime.sleep(60)\n")
    job = subprocess.Popen([sys.executable, "-c", code])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    try:
        clock = TickClock()
        sampler = HostSampler(job.pid, clock=clock, run_dir=run_dir, rescan_s=0.0)
        for _ in range(40):  # until the child has opened its file
            clock.now += 0.5
            sampler.sample()
            if sampler.files is not None and sampler.files.files:
                break
            time.sleep(0.1)
        sampler.stop()
    finally:
        for child in psutil.Process(job.pid).children(recursive=True):
            child.kill()
        job.kill()
        job.wait()
    [mount] = read_mounts(run_dir).query("role == 'data'").to_dict("records")
    assert (mount["files_seen"], mount["bytes_seen"]) == (1, 2048)
    assert (mount["dir_files"], mount["dir_bytes"]) == (4, 4 * 2048)
    assert mount["kind"] in ("local disk", "memory", "overlay", "network filesystem", "FUSE")
    assert read_scans(run_dir)["files_open"].max() == 1
    own = HostSampler(os.getpid(), clock=TickClock(), run_dir=tmp_path)
    assert own.files is None
