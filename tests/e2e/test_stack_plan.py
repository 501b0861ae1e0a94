"""Stack sampling that stays cheap on processes with many threads (doctor.probes.stack_plan):
the plan per process, the threads counted, and py-spy started as planned.

The tests here start jobs, processes or real clocks (tests/e2e); the pure ones are in
tests/unit/test_stack_plan.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from doctor.probes.stack_plan import (
    thread_counts,
)
from doctor.probes.stacks import PySpyRecorder
from doctor.store import layout
from doctor.store.control import post_window


def test_thread_counts_tells_the_threads_that_run_from_the_idle_ones() -> None:
    job = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, threading, time
        stop = threading.Event()
        def spin():
            while not stop.is_set():
                sum(range(1000))
        for _ in range(2):
            threading.Thread(target=spin, daemon=True).start()
        for _ in range(12):
            threading.Thread(target=stop.wait, daemon=True).start()
        print("ready", flush=True)
        time.sleep(30)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert job.stdout is not None
        job.stdout.readline()
        counted = thread_counts([job.pid, 2**22 + 1], interval_s=0.3)
        assert counted[2**22 + 1] is None  # no such process
        found = counted[job.pid]
        assert found is not None
        busy, total = found
        assert 1 <= busy <= 3 and total == 15
    finally:
        job.kill()
        job.wait()


def test_a_process_with_many_busy_threads_gets_py_spy_without_pauses(tmp_path: Path) -> None:
    argv_file = tmp_path / "argv.json"
    spy = tmp_path / "py-spy"
    spy.write_text(f"#!{sys.executable}\n" + textwrap.dedent(f"""
        import json, sys
        json.dump(sys.argv[1:], open({str(argv_file)!r}, "w"))
        out = sys.argv[sys.argv.index("--output") + 1]
        open(out, "w").write("main (train.py:1) 5\\n")
        print("Samples: 5")
    """))
    spy.chmod(0o755)
    pid = os.getpid()
    layout.process_dir(tmp_path, 0, "main", pid).mkdir(parents=True)
    recorder = PySpyRecorder(tmp_path, py_spy=str(spy),
                             count_threads=lambda pids: {pid: (96, 120)})
    post_window(tmp_path, 0, pid, "active")
    recorder.sample()
    deadline = time.monotonic() + 20
    while recorder._running and time.monotonic() < deadline:
        time.sleep(0.05)
        recorder.sample()  # reaps py-spy once it is done
    recorder.stop()
    argv = json.loads(argv_file.read_text())
    assert "--nonblocking" in argv and argv[argv.index("--rate") + 1] == "50"
    meta = json.loads((layout.process_dir(tmp_path, 0, "main", pid) / "stacks.json").read_text())
    assert meta["recorder"] == "py-spy nonblocking"
    assert (meta["busy_threads"], meta["threads"]) == (96, 120)
