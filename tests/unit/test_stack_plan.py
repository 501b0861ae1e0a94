"""Stack sampling that stays cheap on processes with many threads (doctor.probes.stack_plan):
the plan per process, the threads counted, and py-spy started as planned."""

from __future__ import annotations

import json
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
)
from doctor.store import layout
from doctor.store.reader import load_run
from tests.support import record_loop, write_record


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
