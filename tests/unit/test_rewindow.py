"""Later windows (doctor.record.drift, doctor.probes.torch_ops): the drift detector opens a
window again where the steady step slows down for a sustained stretch, or its spikes change, and
stays silent on a steady run and on one spike; within its gap and budget; off when asked."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from doctor.record.drift import OFF, DriftDetector, Settings, settings_of
from tests.support import FakeClock

FAST = Settings(gap=0.0, sustain_min=48, budget=1.0)
#: (the later windows' cost so far, the run's time) as each window opened (run_detector's last)
spent: list[tuple[float, float]] = []


def run_detector(times: list[float], settings: Settings = FAST, cost_s: float = 0.0
                 ) -> tuple[list[int], DriftDetector]:
    """Feed step times (s) to a detector; each time it fires, a window of 5 steps at the step
    time of the moment, plus ``cost_s``, runs (its steps are taken from ``times``). The steps
    at which it fired."""
    clock = FakeClock()
    detector = DriftDetector(settings, clock())
    opened = clock()
    clock.tick(cost_s)
    detector.window_done(opened, clock(), 0, later=False)  # the first window
    fired: list[int] = []
    spent.clear()
    i = 0
    while i < len(times):
        clock.tick(times[i])
        i += 1
        if detector.step(clock()):
            fired.append(i)
            spent.append((detector.spent_ns / 1e9, (clock() - detector.started_ns) / 1e9))
            opened = clock()
            for _ in range(5):
                if i < len(times):
                    clock.tick(times[i])
                    i += 1
            clock.tick(cost_s)
            detector.window_done(opened, clock(), 5, later=True)
    return fired, detector


def noisy(n: int, step_s: float) -> list[float]:
    """``n`` steps of ``step_s`` with a deterministic +-5 % wobble."""
    return [step_s * (1 + 0.05 * ((i * 7919) % 21 - 10) / 10) for i in range(n)]


def test_a_drift_of_half_again_fires_once() -> None:
    fired, _ = run_detector(noisy(300, 0.1) + noisy(1500, 0.15))
    assert len(fired) == 1
    assert 300 < fired[0] <= 300 + 48 + 2 * 16  # a sustained stretch after the drift, no more


def test_a_steady_run_stays_silent() -> None:
    fired, detector = run_detector(noisy(5000, 0.1))
    assert fired == []
    assert detector.base_median == pytest.approx(0.1e9, rel=0.06)


def test_one_spike_stays_silent() -> None:
    times = noisy(2000, 0.1)
    times[700] = 10.0  # one stall of a hundred steps
    fired, _ = run_detector(times)
    assert fired == []


def test_spikes_that_change_fire() -> None:
    """The steady step keeps its pace; from step 400 every fourth step takes 3x (a collector
    that began to pause): the blocks' mean rises by half."""
    times = [t * (3 if i >= 400 and i % 4 == 0 else 1) for i, t in enumerate(noisy(2000, 0.1))]
    fired, _ = run_detector(times)
    assert len(fired) == 1 and fired[0] > 400


def test_a_speed_up_is_no_drift() -> None:
    fired, _ = run_detector(noisy(300, 0.2) + noisy(1500, 0.1))
    assert fired == []


def test_the_later_windows_stay_within_their_budget() -> None:
    """The run slows and recovers again and again; each window costs 1 s. Every window opened
    keeps the later windows' total within 1 % of the run so far, and some drifts wait."""
    times = (noisy(200, 0.1) + noisy(200, 0.2)) * 20
    settings = Settings(gap=0.0, sustain_min=48, budget=0.01)
    fired, detector = run_detector(times, settings, cost_s=1.0)
    assert 2 <= len(fired) < 10  # of 20 drifts
    for before, run_s in spent:
        assert before + 1.0 <= 0.01 * run_s  # with this window's, within 1 % of the run so far
    assert detector.spent_ns / 1e9 == pytest.approx(len(fired) * 1.0, rel=0.2)


def test_the_stack_sampling_counts_in_the_cost() -> None:
    """A later window costs 0.2 s to close; for the rest of the 8 s of stack sampling after it
    opened (7.3 s), each step takes 10 % longer than the pace it opened at: 0.66 s more, in the
    window's cost."""
    clock = FakeClock()
    detector = DriftDetector(FAST, clock())
    detector.last_median = 0.1e9
    opened = clock()
    clock.tick(5 * 0.1 + 0.2)
    detector.window_done(opened, clock(), 5, later=True, span_ns=8 * 10**9)
    assert detector.spent_ns == pytest.approx(0.2e9)
    while clock() < opened + 12e9:
        clock.tick(0.11 if clock() < opened + 8e9 else 0.1)
        detector.step(clock())
    assert detector.spent_ns == pytest.approx(0.86e9, rel=0.03)
    assert detector.dearest_ns == pytest.approx(0.86e9, rel=0.03)  # the next one's estimate


def test_windows_keep_their_gap() -> None:
    times = (noisy(200, 0.1) + noisy(200, 0.2)) * 10  # a drift every 40 s
    fired, _ = run_detector(times, Settings(gap=100.0, sustain_min=48, budget=1.0))
    starts = [sum(times[:i]) for i in fired]
    assert len(fired) >= 2
    assert all(b - a >= 100 for a, b in itertools.pairwise(starts))


def test_the_settings_come_from_the_environment() -> None:
    assert settings_of({"DOCTOR_REWINDOW": "off"}) == OFF
    assert settings_of({}) == Settings()
    assert settings_of({"DOCTOR_REWINDOW": "gap=0,sustain_min=20"}) == Settings(
        gap=0.0, sustain_min=20)
    # what does not parse is left as it was; never an error in the job
    assert settings_of({"DOCTOR_REWINDOW": "gap=soon,nope=1,block=-3,=,"}) == Settings()


# -- in the job: the window opens again, with its own trace ------------------------------------

def drifting_loop(run_dir: Path, environ: dict[str, str], steps: int = 400,
                  drift_at: int = 150) -> tuple[object, FakeClock]:
    """A recorded loop whose steps take 10 ms, then 15 ms from ``drift_at`` on, under a real
    Session and its deep window (steps 8-12) with torch.profiler."""
    from doctor.probes.torch_ops import DeepWindow
    from doctor.record.session import STEP_OPTIMIZER, Session

    clock = FakeClock()
    session = Session(run_dir, clock=clock, window_start=8, window_steps=5)
    window = DeepWindow(session, 8, 5, environ=environ)
    window.start()
    for i in range(steps):
        clock.tick(0.01 if i < drift_at else 0.015)
        session.count_step(STEP_OPTIMIZER)
    session.close()
    return window, clock


QUICK = {"DOCTOR_REWINDOW": "gap=0,sustain_min=32,budget=1", "DOCTOR_SHAPES": "off"}


def test_the_job_opens_a_second_window_with_its_own_trace(tmp_path: Path) -> None:
    drifting_loop(tmp_path, dict(QUICK))
    [proc] = list(tmp_path.glob("rank-0/main-*"))
    assert sorted(p.name for p in proc.glob("trace*")) == ["trace-2.json", "trace.json"]
    meta = json.loads((proc / "meta.json").read_text())
    assert meta["window"]["start_step"] == 8 and meta["window"]["state"] == "done"
    [later] = meta["later_windows"]
    assert later["state"] == "done" and later["window"] == 2 and later["steps_profiled"] == 5
    assert later["start_step"] > 150
    assert later["base_step_s"] == pytest.approx(0.01)
    assert later["cost_s"] >= 0


def test_rewindow_off_keeps_one_window(tmp_path: Path) -> None:
    drifting_loop(tmp_path, {**QUICK, "DOCTOR_REWINDOW": "off"})
    [proc] = list(tmp_path.glob("rank-0/main-*"))
    assert [p.name for p in proc.glob("trace*")] == ["trace.json"]
    assert "later_windows" not in json.loads((proc / "meta.json").read_text())


def test_a_steady_job_keeps_one_window(tmp_path: Path) -> None:
    drifting_loop(tmp_path, dict(QUICK), drift_at=10**6)
    [proc] = list(tmp_path.glob("rank-0/main-*"))
    assert [p.name for p in proc.glob("trace*")] == ["trace.json"]


def test_no_second_cuda_window_without_cupti_teardown(tmp_path: Path) -> None:
    """A CUDA older than 12.6 (no teardown asked) and a job that did not choose TEARDOWN_CUPTI:
    a later CUDA window would start CUPTI again on top of the one left attached: none opens."""
    from doctor.probes import torch_ops
    from doctor.record.session import Session

    session = Session(tmp_path, clock=FakeClock())
    window = torch_ops.DeepWindow(session, 8, 5, environ=dict(QUICK))
    window.index, window._cuda_windows, window.state = 1, 1, torch_ops.DONE
    real = torch_ops.profiler_activities
    torch_ops.profiler_activities = lambda torch: ["ProfilerActivity.CUDA"]  # type: ignore
    try:
        window._open(300)
    finally:
        torch_ops.profiler_activities = real
    assert window.index == 1 and window.drift is None
    meta = json.loads(next(tmp_path.glob("rank-0/main-*/meta.json")).read_text())
    assert "CUPTI" in meta["later_windows_off"]


def test_the_parent_samples_a_later_window_s_stacks_apart(tmp_path: Path) -> None:
    """A later window's signal: the parent's py-spy (a stand-in here) samples the process again,
    into stacks-2.txt and stacks-2.json; the first window's stacks stay as they were."""
    import os
    import time

    from doctor.probes.stacks import PySpyRecorder
    from doctor.store import layout
    from doctor.store.control import post_later_window, post_window
    from doctor.store.stacks import read_stacks

    fake = tmp_path / "py-spy"
    events = ('[{"ph": "B", "tid": 7, "ts": 0, "name": "thread (1)", "args": {}}, '
              '{"ph": "B", "tid": 7, "ts": 0, "name": "f", "args": {"filename": "x.py", '
              '"line": 1}}, {"ph": "E", "tid": 7, "ts": 60000, "name": "f", "args": {}}, '
              '{"ph": "E", "tid": 7, "ts": 60000, "name": "thread (1)", "args": {}}]')
    fake.write_text('#!/bin/sh\nwhile [ $# -gt 0 ]; do [ "$1" = --output ] && out="$2"; shift; '
                    f"done\necho '{events}' > \"$out\"\n"
                    'echo "Samples: 3"\n')
    fake.chmod(0o755)
    run_dir = tmp_path / "run"
    pid = os.getpid()
    proc = layout.process_dir(run_dir, 0, "main", pid)
    proc.mkdir(parents=True)
    recorder = PySpyRecorder(run_dir, py_spy=str(fake), count_threads=lambda pids: {})
    post_window(run_dir, 0, pid, "active")
    recorder.sample()
    post_later_window(run_dir, 0, pid, 2)
    recorder.sample()
    recorder.sample()  # nothing new: each window is sampled once
    deadline = time.monotonic() + 10
    while recorder._running and time.monotonic() < deadline:
        time.sleep(0.05)
        recorder._reap()
    assert sorted(p.name for p in proc.iterdir()) == [
        "stack-times-2.txt", "stack-times.txt", "stacks-2.json", "stacks-2.txt", "stacks.json",
        "stacks.txt"]  # py-spy's chrome traces made into samples and their times
    assert layout.later_stacks(proc) == [2]
    later = read_stacks(proc, window=2)
    assert later is not None and later.taken == 3
    assert later.stacks == {("f (x.py:1)",): 3}  # 60 ms at the plan's 50 Hz


def test_no_window_from_a_thread_other_than_torchs(tmp_path: Path) -> None:
    """A job that trains in a thread that did not import torch: the first torch.profiler there
    makes Kineto print 'External init callback must run in same thread as registerClient' into
    the job's stderr, so the window stays closed and says why."""
    import threading

    from doctor.probes import torch_ops
    from doctor.record.session import STEP_OPTIMIZER, Session

    clock = FakeClock()
    session = Session(tmp_path, clock=clock, window_start=8, window_steps=5)
    window = torch_ops.DeepWindow(session, 8, 5, environ=dict(QUICK))
    window.start()  # as torch is imported: this thread

    def train() -> None:
        for _ in range(20):
            clock.tick(0.01)
            session.count_step(STEP_OPTIMIZER)

    trainer = threading.Thread(target=train)
    trainer.start()
    trainer.join()
    session.close()
    assert window.index == 0 and window.state == torch_ops.FAILED
    meta = json.loads(next(tmp_path.glob("rank-0/main-*/meta.json")).read_text())
    assert meta["window"]["reason"] == torch_ops.OTHER_THREAD
    assert not list(tmp_path.glob("rank-0/main-*/trace*"))
