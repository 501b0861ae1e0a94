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
