"""The classifier and the io/decode/preprocess attribution, on recorded stack samples.

The tests here start jobs, processes or real clocks (tests/e2e); the pure ones are in
tests/unit/test_input_split.py.
"""

from __future__ import annotations

import json
import sys
import textwrap
import threading
import time
from itertools import pairwise
from pathlib import Path

from doctor.probes.stacks import InProcessSampler, PySpyRecorder
from doctor.store.control import in_process_stacks, read_control
from doctor.store.stack_times import read_stack_times
from doctor.store.stacks import read_stacks
from tests.support import LOADER_MAIN_STACK, doctor_cmd, record_loop, write_record


def test_a_malformed_rules_file_is_one_line_and_exit_status_2(tmp_path: Path) -> None:
    run = tmp_path / "run"
    main = record_loop(run, 30, wait_s=0.08, compute_s=0.02).directory
    write_record(run)
    decode = (*LOADER_MAIN_STACK, "ImageFile.load (PIL/ImageFile.py:300)")
    (main / "stacks.txt").write_text(f"{';'.join(decode)} 80\n")
    (main / "stacks.json").write_text(json.dumps(
        {"recorder": "py-spy", "rate_hz": 50, "start_ns": 0, "end_ns": int(2e9), "taken": 80}))
    mine = tmp_path / "mine.json"
    mine.write_text('{"rules": [')
    result = doctor_cmd("report", str(run), "--format", "json",
                        env={"DOCTOR_FRAME_RULES": str(mine)})
    assert result.returncode == 2
    assert result.stdout == ""
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"doctor: DOCTOR_FRAME_RULES={mine}: not JSON")


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


def busy_then_sleep(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        busy(0.01)
        time.sleep(0.03)


def test_in_process_sampler_counts_blocked_time_too(tmp_path: Path) -> None:
    sampler = InProcessSampler(tmp_path, threading.get_ident(),
                               rate_hz=100, span_s=0.5)
    sampler.start()
    busy_then_sleep(0.8)
    sampler._thread.join(timeout=5)
    got = read_stacks(tmp_path)
    assert got is not None and got.recorder == "in-process"
    assert got.taken == got.count > 0
    asleep = sum(n for s, n in got.stacks.items() if s[-1].startswith("busy_then_sleep "))
    assert asleep >= 0.5 * got.count  # 3/4 of the time is spent asleep
    # the same samples on the time axis: runs in order, each ending where the next begins
    runs = read_stack_times(tmp_path, main_thread=None)
    assert runs and all(a[1] == b[0] for a, b in pairwise(runs))
    took = sum(t1 - t0 for t0, t1, _ in runs)
    slept = sum(t1 - t0 for t0, t1, s in runs if s[-1].startswith("busy_then_sleep "))
    assert slept >= 0.5 * took


def fake_py_spy(tmp_path: Path, body: str) -> str:
    path = tmp_path / "py-spy"
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return str(path)


def test_refused_ptrace_falls_back_to_the_in_process_sampler(tmp_path: Path) -> None:
    spy = fake_py_spy(tmp_path, """
        import sys
        print("Error: Permission denied (os error 1)", file=sys.stderr)
        sys.exit(1)
    """)
    recorder = PySpyRecorder(tmp_path, py_spy=spy)
    recorder.start()
    deadline = time.monotonic() + 30
    while not in_process_stacks(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)  # the ptrace check runs in a thread: wait for its answer
    assert in_process_stacks(tmp_path)
    assert "Permission denied" in read_control(tmp_path).stacks_reason
    status = recorder.check()
    assert status.ok and "in-process sampler" in status.reason
    assert "SYS_PTRACE" in status.hint
