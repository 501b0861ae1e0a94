"""In which call a slow step's time went (issue 34, item 0/2): the stack samples on the time axis
(doctor.store.stack_times, from py-spy's chrome trace or the in-process sampler), placed on the
slow steps they cover (doctor.analyse.spike_calls), said in the slow-step finding, the long
stall's and the report's slow-steps section."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from doctor.analyse.evidence import Evidence
from doctor.analyse.spike_calls import call_site, spike_calls
from doctor.pipeline import analyze_run
from doctor.probes.gc_pauses import GcProbe
from doctor.record.session import CLOSE, Session
from doctor.reports.json import verdict_data
from doctor.reports.text import render_text
from doctor.rules.other import other_time
from doctor.store.stack_times import from_chrometrace, parse_times, write_stack_times
from doctor.store.stacks import format_raw, write_stacks_meta
from tests.support import FakeClock, write_record

STEP_S, STALL_S = 0.1, 1.0
SOURCE = ("import time\n"
          "def train_step(model, batch):\n"
          "    return model(batch)\n"
          "def fetch(sock, buf):\n"
          "    return sock.recv_into(buf)\n"
          "def wait():\n"
          "    time.sleep(5)\n")
LIB = "/usr/lib/python3.11/site-packages"


def stacks(train: Path) -> dict[str, tuple[str, ...]]:
    top = f"<module> ({train}:20)"
    return {
        "forward": (top, f"train_step ({train}:3)",
                    f"Module._call_impl ({LIB}/torch/nn/modules/module.py:1500)",
                    f"Linear.forward ({LIB}/torch/nn/modules/linear.py:116)"),
        "recv": (top, f"fetch ({train}:5)",
                 "SocketIO.readinto (/usr/lib/python3.11/socket.py:706)"),
        "sleep": (top, f"wait ({train}:7)"),
    }


def test_the_call_site_is_the_job_s_innermost_frame_and_the_call_it_made(tmp_path: Path
                                                                          ) -> None:
    train = tmp_path / "train.py"
    train.write_text(SOURCE)
    s = stacks(train)
    assert call_site(s["forward"]) == ("train.py:3 in train_step -> torch.nn.modules.module."
                                       "Module._call_impl > torch.nn.modules.linear.Linear.forward")
    assert call_site(s["recv"]) == "train.py:5 in fetch -> socket.SocketIO.readinto"
    # a call into C has no frame of its own: its source line names it
    assert call_site(s["sleep"]) == "train.py:7 in wait -> time.sleep"
    # no frame of the job's own: the innermost library function
    assert call_site(s["forward"][2:]) == "torch.nn.modules.linear.Linear.forward"


def test_py_spy_s_chrome_trace_becomes_runs_that_tile_the_span() -> None:
    """Begin and end events where the stack changed (an end and a begin at one time: the next
    sample differs), in microseconds from py-spy's start; the raw counts at the rate."""
    def ev(ph: str, ts: int, name: str, line: int = 0, tid: int = 9) -> dict[str, object]:
        return {"ph": ph, "ts": ts, "tid": tid, "name": name,
                "args": {"filename": "/t.py" if line else "", "line": line}}

    events = [ev("B", 0, "thread (42)"), ev("B", 0, "main", 1), ev("B", 0, "f", 3),
              ev("E", 100_000, "f", 3), ev("B", 100_000, "g", 6), ev("E", 120_000, "g", 6),
              ev("E", 120_000, "main", 1), ev("E", 120_000, "thread (42)"),
              ev("B", 5_000, "thread (43)", tid=10), ev("B", 5_000, "h", 2, tid=10),
              {"ph": "M", "name": "process_name"}]
    counts, runs = from_chrometrace(events, rate_hz=50)
    thread, main = "thread (42)", "main (/t.py:1)"
    assert runs[0] == (0, 100_000, (thread, main, "f (/t.py:3)"))
    assert (100_000, 120_000, (thread, main, "g (/t.py:6)")) in runs
    assert counts[(thread, main, "f (/t.py:3)")] == 5  # 100 ms at 50 Hz
    assert counts[(thread, main, "g (/t.py:6)")] == 1
    # a trace cut short keeps its last sample, one period long
    assert (5_000, 25_000, ("thread (43)", "h (/t.py:2)")) in runs
    text = "".join(f"{a} {b} {';'.join(s)}\n" for a, b, s in runs)
    assert parse_times(text, main_thread=42) == [(0, 100_000, (main, "f (/t.py:3)")),
                                                 (100_000, 120_000, (main, "g (/t.py:6)"))]
    assert len(parse_times(text, main_thread=7)) == 3  # not found: every thread's


def sampled_loop(run_dir: Path, train: Path, steps: int = 40, sampled: range = range(18, 31),
                 slow_at: tuple[int, ...] = (22, 26)) -> None:
    """Optimizer steps of STEP_S in ``train_step``; in the steps ``slow_at`` STALL_S more,
    three quarters of it in a socket read and the rest asleep; the training thread's stacks
    sampled over the steps ``sampled``."""
    clock = FakeClock()
    session = Session(run_dir, rank=0, clock=clock, window_start=10**9)
    probe = GcProbe(session)  # a run recorded with the collector's probe: its slow steps said
    session.on(CLOSE, probe._close)
    s = stacks(train)
    runs: list[tuple[int, int, tuple[str, ...]]] = []
    start = end = 0
    for i in range(steps):
        if i == sampled.start:
            start = clock.now
        t = clock.now
        clock.tick(STEP_S)
        runs.append((t, clock.now, s["forward"]))
        if i in slow_at:
            runs.append((clock.now, clock.tick(0.75 * STALL_S), s["recv"]))
            runs.append((clock.now, clock.tick(0.25 * STALL_S), s["sleep"]))
        session.record_optimizer_start()
        session.record_optimizer_end(0)
        if i == sampled.stop - 1:
            end = clock.now
    session.close()
    mine = [((a - start) // 1000, (b - start) // 1000, st) for a, b, st in runs
            if a >= start and b <= end]
    write_stack_times(session.directory, mine)
    (session.directory / "stacks.txt").write_text(format_raw({st: 1 for *_, st in mine}))
    write_stacks_meta(session.directory, recorder="py-spy", rate_hz=50, start_ns=start,
                      end_ns=end, taken=len(mine))
    write_record(run_dir, t0_monotonic_s=0.0)


def test_unexplained_slow_steps_name_the_calls_their_extra_time_went_to(tmp_path: Path
                                                                         ) -> None:
    train = tmp_path / "train.py"
    train.write_text(SOURCE)
    run_dir = tmp_path / "run"
    sampled_loop(run_dir, train)
    analysis = analyze_run(run_dir)
    slow = analysis.sections.slow_steps
    assert slow is not None
    assert {s.step for s in slow.steps} == {22, 26}
    calls = spike_calls(slow.sites, [(0, 22), (0, 26)])
    assert calls is not None and calls.steps == 2
    shares = {c.site: c.share for c in calls.calls}
    # the forward pass every step makes is not the slow steps' extra time
    assert shares == pytest.approx({"train.py:5 in fetch -> socket.SocketIO.readinto": 0.75,
                                    "train.py:7 in wait -> time.sleep": 0.25}, abs=0.01)
    assert calls.extra_s == pytest.approx(2 * STALL_S, rel=0.02)
    # sampled steps are analysed where the parent measured the sampler's pauses (thread
    # times, not recorded here): the slow-step finding over them says the calls
    walls = [STALL_S + STEP_S if n in (22, 26) else STEP_S for n in range(4, 41)]
    ledger = pd.DataFrame({"rank": 0, "step": range(4, 41), "wall_s": walls, "other": 0.0})
    [spikes] = other_time(Evidence(ledger=ledger, slow_steps=slow))
    assert spikes.id == "steps.spikes"
    assert "75% of the extra time in train.py:5 in fetch -> socket.SocketIO.readinto" \
        in spikes.title
    assert "compute" not in spikes.title
    assert spikes.evidence["extra_time_calls"][0]["share"] == pytest.approx(0.75, abs=0.01)
    # each is a long stall too (over 10x the median, over 1 s): its own samples said
    stall = next(f for f in analysis.verdict.findings if f.evidence.get("step") == 22)
    assert "its stack samples: 75% of the extra time in train.py:5 in fetch" in stall.title
    text = render_text(analysis)
    assert "stack samples of 2 of them: 75% of the extra time in train.py:5 in fetch" in text
    group = next(g for g in verdict_data(analysis)["slow_steps"]["groups"]
                 if g["cause"] == "unexplained")
    assert group["sampled_slow_steps"] == 2


def test_slow_steps_outside_the_samples_say_no_call(tmp_path: Path) -> None:
    """Stacks sampled over other steps: nothing is placed on the slow ones, nothing said."""
    train = tmp_path / "train.py"
    train.write_text(SOURCE)
    run_dir = tmp_path / "run"
    sampled_loop(run_dir, train, sampled=range(5, 15))
    analysis = analyze_run(run_dir)
    slow = analysis.sections.slow_steps
    assert slow is not None and {s.step for s in slow.steps} == {22, 26}
    assert not slow.sites
    assert all("stack samples" not in f.title and "extra_time_calls" not in f.evidence
               for f in analysis.verdict.findings)
    assert "stack samples of" not in render_text(analysis)
