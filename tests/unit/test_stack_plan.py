"""Stack sampling that stays cheap on processes with many threads (doctor.probes.stack_plan):
the plan per process, the threads counted, and py-spy started as planned."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from doctor.analyse.facts import sampling_notes
from doctor.probes.stack_plan import (
    MAX_SPAN_S,
    PAUSE_BUDGET,
    PAUSE_PER_BUSY_THREAD_S,
    PAUSE_PER_IDLE_THREAD_S,
    sampling_plan,
    thread_counts,
)
from doctor.probes.stacks import PySpyRecorder
from doctor.store import layout
from doctor.store.control import post_window
from doctor.store.reader import load_run
from tests.loops import record_loop, write_record


def test_few_busy_threads_are_paused_at_the_full_rate() -> None:
    for threads in (None, (1, 1), (8, 12), (1, 17)):
        plan = sampling_plan(threads)
        assert plan.blocking and plan.rate_hz == 50 and plan.span_s == 8


def test_many_idle_python_threads_lengthen_each_pause_too() -> None:
    plan = sampling_plan((1, 65))  # measured 1.36x at 50 Hz
    assert plan.blocking and 10 <= plan.rate_hz < 20 and plan.span_s == MAX_SPAN_S


def test_more_busy_threads_are_sampled_slower_for_longer_within_the_budget() -> None:
    plan = sampling_plan((20, 24))
    assert plan.blocking and 10 <= plan.rate_hz < 50
    pause = 20 * PAUSE_PER_BUSY_THREAD_S + 4 * PAUSE_PER_IDLE_THREAD_S
    assert plan.rate_hz * pause == pytest.approx(PAUSE_BUDGET)
    assert plan.rate_hz * plan.span_s == pytest.approx(400)  # as many samples
    assert plan.span_s <= MAX_SPAN_S
    assert (plan.busy_threads, plan.threads) == (20, 24)


def test_past_that_the_process_is_read_without_pausing_it() -> None:
    plan = sampling_plan((96, 100))
    assert not plan.blocking and plan.rate_hz == 50 and plan.recorder == "py-spy nonblocking"


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


def test_the_report_says_which_processes_were_read_without_pausing(tmp_path: Path) -> None:
    record_loop(tmp_path, 10)
    write_record(tmp_path)
    [proc_dir] = [d for d, *_ in layout.process_dirs(tmp_path)]
    (proc_dir / "stacks.txt").write_text("main (train.py:1) 5\n")
    (proc_dir / "stacks.json").write_text(json.dumps({
        "recorder": "py-spy nonblocking", "rate_hz": 50, "start_ns": 0,
        "end_ns": int(time.time()), "taken": 5, "busy_threads": 64}))
    [note] = sampling_notes(load_run(tmp_path))
    assert "rank 0 main" in note and "without pausing" in note


def test_doctor_stacks_forces_a_mode_whatever_the_threads() -> None:
    assert sampling_plan((96, 100), forced="blocking").blocking
    assert sampling_plan((96, 100), forced="blocking").rate_hz == 50
    assert not sampling_plan((1, 1), forced="nonblocking").blocking
    assert sampling_plan((96, 100), forced="in-process") == sampling_plan((96, 100))


def test_the_report_says_which_processes_were_sampled_slower(tmp_path: Path) -> None:
    record_loop(tmp_path, 10)
    write_record(tmp_path)
    [proc_dir] = [d for d, *_ in layout.process_dirs(tmp_path)]
    (proc_dir / "stacks.txt").write_text("main (train.py:1) 5\n")
    (proc_dir / "stacks.json").write_text(json.dumps({
        "recorder": "py-spy", "rate_hz": 21, "start_ns": 0, "end_ns": 1, "taken": 5}))
    [note] = sampling_notes(load_run(tmp_path))
    assert "sampled at 21 Hz for longer instead of 50 Hz" in note


def test_a_mode_doctor_stacks_asked_for_is_said_as_asked(tmp_path: Path) -> None:
    record_loop(tmp_path, 10)
    write_record(tmp_path)
    [proc_dir] = [d for d, *_ in layout.process_dirs(tmp_path)]
    (proc_dir / "stacks.txt").write_text("main (train.py:1) 5\n")
    plan = sampling_plan((1, 1), forced="nonblocking")
    (proc_dir / "stacks.json").write_text(json.dumps({
        "recorder": plan.recorder, "rate_hz": 50, "start_ns": 0, "end_ns": 1, "taken": 5}))
    [note] = sampling_notes(load_run(tmp_path))
    assert "as DOCTOR_STACKS asked" in note
