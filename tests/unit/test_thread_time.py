"""What the training thread did in each step (schedstat from the parent), and the stack
sampler's pauses taken out of the steps it overlapped: recorded loops with a fake clock and a
schedstat timeline written as the host probe writes it."""

from __future__ import annotations

import json
from array import array
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from doctor.analyse.ledger import build_ledger
from doctor.analyse.step_table import step_table
from doctor.analyse.steps import training_processes
from doctor.analyse.thread_time import sampler_note
from doctor.analyse.window import WindowSplit
from doctor.categories import CATEGORIES
from doctor.probes.host import main_thread_times
from doctor.record.session import STEP_MANUAL, Session
from doctor.store.reader import load_run
from doctor.store.samples import PROC_COLUMNS, SYSTEM_COLUMNS, save_host
from tests.support import FakeClock, write_record

T0_S = 1000.0  # the run's start on the fake clock (FakeClock starts at 10**12 ns)
TICK_S = 0.5  # the parent's sampling interval


def record_steps(run_dir: Path, steps: list[tuple[float, float, float]],
                 sampled: tuple[int, int] | None = None,
                 threads: tuple[int, int] | None = None) -> Session:
    """A loop of manual steps, each (running, runnable, blocked) seconds of its thread, in that
    order; the parent's schedstat samples of the thread every TICK_S; with ``sampled`` (first,
    last step), a stack sampler's span over those steps (``threads``: busy and all threads
    the sampler counted)."""
    clock = FakeClock()
    session = Session(run_dir, rank=0, clock=clock, window_start=10**9)
    # the thread's state over time: (end of the segment, s from the run's start, state)
    segments: list[tuple[float, str]] = []
    bounds = []
    session.mark_step(STEP_MANUAL)
    for running, runnable, blocked in steps:
        start = clock() * 1e-9 - T0_S
        for state, seconds in (("run", running), ("queue", runnable), ("block", blocked)):
            clock.tick(seconds)
            segments.append((clock() * 1e-9 - T0_S, state))
        session.mark_step(STEP_MANUAL)
        bounds.append((start, clock() * 1e-9 - T0_S))
    session.close()
    write_record(run_dir, t0_monotonic_s=T0_S)
    ticks = np.arange(0.0, segments[-1][0] + TICK_S, TICK_S)
    on_cpu, delay = np.zeros(len(ticks)), np.zeros(len(ticks))
    before = 0.0
    for end, state in segments:
        spent = np.clip(ticks - before, 0.0, end - before)
        if state == "run":
            on_cpu += spent
        elif state == "queue":
            delay += spent
        before = end
    n = len(ticks)
    procs = {c: array("d", np.full(n, np.nan)) for c in PROC_COLUMNS}
    for name, values in (("t_s", ticks), ("pid", np.full(n, session.pid)),
                         ("ppid", np.full(n, 1.0)), ("cpu_s", on_cpu), ("on_cpu_s", on_cpu),
                         ("run_delay_s", delay)):
        procs[name] = array("d", values)
    save_host(run_dir, procs, {c: array("d") for c in SYSTEM_COLUMNS})
    if sampled is not None:
        first, last = bounds[sampled[0] - 1][0], bounds[sampled[1] - 1][1]
        (session.directory / "stacks.json").write_text(json.dumps(
            {"recorder": "py-spy", "rate_hz": 50, "start_ns": int((first + T0_S) * 1e9),
             "end_ns": int((last + T0_S) * 1e9), "taken": 100,
             **({"busy_threads": threads[0], "threads": threads[1]} if threads else {})}))
    return session


def ledger_of(run_dir: Path, fractions: dict[str, float] | None = None
              ) -> tuple[pd.DataFrame, pd.DataFrame]:
    run = load_run(run_dir)
    ranks = training_processes(run)
    table = step_table(run, ranks)
    windows = {0: WindowSplit(fractions, "cpu", fractions.get("compute", 0.0))} \
        if fractions else {}
    return table, build_ledger(table, windows)


def test_schedstat_gives_the_main_threads_time_on_a_core_and_waiting_for_one(
        tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "schedstat").write_text("2500000000 500000000 1234\n")
    assert main_thread_times(42, str(tmp_path)) == pytest.approx((2.5, 0.5))
    (tmp_path / "43").mkdir()
    (tmp_path / "43" / "schedstat").write_text("garbage\n")
    assert all(np.isnan(main_thread_times(43, str(tmp_path))))
    assert all(np.isnan(main_thread_times(44, str(tmp_path))))  # gone: no file


def test_a_step_blocked_eight_seconds_is_other_not_compute(tmp_path: Path) -> None:
    steps = [(0.1, 0.0, 0.0)] * 40 + [(0.1, 0.0, 8.0)] + [(0.1, 0.0, 0.0)] * 40
    record_steps(tmp_path, steps)
    _table, ledger = ledger_of(tmp_path, {"compute": 0.9, "other": 0.1})
    stall = ledger[ledger["wall_s"] > 5].iloc[0]
    assert stall["analyzed"]
    assert stall["blocked_s"] == pytest.approx(8.0, abs=0.3)
    assert stall["compute"] < 0.5  # not 90 % of 8.1 s
    assert stall["other"] > 7.5
    ordinary = ledger[ledger["analyzed"] & (ledger["wall_s"] < 0.2)]
    # far from the stall, an ordinary step keeps the window's split
    far = ordinary[(ordinary["step"] < 35) | (ordinary["step"] > 50)]
    assert (far["compute"] / far["wall_s"]).median() == pytest.approx(0.9, abs=0.02)
    assert np.allclose(ledger[list(CATEGORIES)].sum(axis=1), ledger["wall_s"])
    # without a window the blocked time is other all the same
    _, alone = ledger_of(tmp_path)
    assert alone.loc[alone["wall_s"] > 5, "other"].iloc[0] > 7.5


def test_a_thread_waiting_for_a_core_is_runnable_not_blocked(tmp_path: Path) -> None:
    record_steps(tmp_path, [(0.05, 0.05, 0.0)] * 60)
    _table, ledger = ledger_of(tmp_path)
    steady = ledger[ledger["analyzed"]]
    assert (steady["runnable_s"] / steady["wall_s"]).median() == pytest.approx(0.5, abs=0.05)
    assert steady["blocked_other_s"].sum() < 0.05 * steady["wall_s"].sum()
    assert steady["compute"].sum() / steady["wall_s"].sum() > 0.9


def test_sampled_steps_are_kept_with_the_samplers_pauses_taken_out(tmp_path: Path) -> None:
    # 100 ms of compute a step; under the sampler each step is stopped 30 ms more
    steps = [(0.1, 0.0, 0.0)] * 40 + [(0.1, 0.0, 0.03)] * 60 + [(0.1, 0.0, 0.0)] * 40
    record_steps(tmp_path, steps, sampled=(41, 100))
    table, ledger = ledger_of(tmp_path)
    sampled = ledger[ledger["sampled"]]
    assert len(sampled) >= 60
    assert sampled["analyzed"].all()
    inner = sampled[(sampled["step"] > 45) & (sampled["step"] < 95)]
    assert inner["sampler_s"].median() == pytest.approx(0.03, abs=0.005)
    assert table.loc[table["sampled"], "sampler_measured"].all()
    assert inner["wall_s"].median() == pytest.approx(0.1, abs=0.005)  # as the job ran it
    steady = ledger[ledger["analyzed"]]
    assert steady["compute"].sum() / steady["wall_s"].sum() > 0.95
    notes = sampler_note(table)
    assert len(notes) == 1 and "count in the shares" in notes[0]


def test_a_stall_during_sampling_is_not_taken_for_the_samplers_pause(tmp_path: Path) -> None:
    steps = ([(0.1, 0.0, 0.0)] * 40 + [(0.1, 0.0, 0.01)] * 30 + [(0.1, 0.0, 8.0)]
             + [(0.1, 0.0, 0.01)] * 30 + [(0.1, 0.0, 0.0)] * 40)
    record_steps(tmp_path, steps, sampled=(41, 101))
    _table, ledger = ledger_of(tmp_path, {"compute": 0.9, "other": 0.1})
    stall = ledger[ledger["wall_s"] > 5].iloc[0]
    assert stall["analyzed"] and stall["sampled"]
    assert stall["sampler_s"] < 0.5  # the pause rate of the other sampled steps, not the stall
    assert stall["other"] > 7.0
    run_s = float(ledger.loc[ledger["analyzed"], "wall_s"].sum())
    assert ledger.loc[ledger["analyzed"], "other"].sum() / run_s > 0.3


def test_with_too_few_steps_outside_sampling_the_planned_pause_stands_in(tmp_path: Path) -> None:
    # every step after the first few is sampled: nothing to measure the pause against
    steps = [(0.1, 0.0, 0.0)] * 5 + [(0.1, 0.0, 0.01)] * 60
    record_steps(tmp_path, steps, sampled=(6, 65), threads=(2, 5))
    table, _ = ledger_of(tmp_path)
    sampled = table[table["sampled"] & table["analyzed"]]
    assert not sampled["sampler_measured"].any()
    # 2 busy threads at 0.14 ms and 3 idle at 0.1 ms a sample, 50 a second, over 0.1 s on a core
    planned = (2 * 1.4e-4 + 3 * 1e-4) * 50 * 0.1
    assert sampled["sampler_s"].median() == pytest.approx(planned, rel=0.1)
    assert "pause per thread" in sampler_note(table)[0]
    # without the threads counted (an older run), nothing is taken out, and the steps count
    record_steps(tmp_path / "old", steps, sampled=(6, 65))
    table, _ = ledger_of(tmp_path / "old")
    assert table.loc[table["sampled"], "sampler_s"].sum() == 0
    assert table.loc[table["sampled"], "analyzed"].all()


def test_a_gpu_jobs_blocked_thread_keeps_the_windows_split(tmp_path: Path) -> None:
    # a GPU job's thread blocks while its GPU computes: that is not "other"
    record_steps(tmp_path, [(0.02, 0.0, 0.08)] * 40 + [(0.02, 0.0, 2.0)]
                 + [(0.02, 0.0, 0.08)] * 40)
    run = load_run(tmp_path)
    table = step_table(run, training_processes(run))
    gpu = build_ledger(table, {0: WindowSplit({"compute": 0.8, "other": 0.2}, "cuda", 0.7)},
                       cpu=False)
    long = gpu[gpu["wall_s"] > 1].iloc[0]
    assert long["compute"] / long["wall_s"] == pytest.approx(0.8, abs=0.01)
    assert long["blocked_other_s"] == 0
    # on a CPU job, an ordinary step blocked 80 % has 20 % compute; the long one its 20 ms
    cpu = build_ledger(table, {0: WindowSplit({"compute": 0.2, "other": 0.8}, "cpu", 0.2)})
    assert cpu.loc[cpu["wall_s"] > 1, "compute"].iloc[0] == pytest.approx(0.02, abs=0.01)
