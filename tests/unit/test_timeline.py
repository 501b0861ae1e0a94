"""The run's timeline (timeline.json.gz, doctor export): the Chrome-trace format, every step once,
bounded detail, and the profiler window's events on the rings' clock."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from doctor.analyse.timeline import INTERVAL_CAP
from doctor.outputs import export_timeline, finalize_run
from doctor.store.windows import CLOCK_SLACK_NS, on_process_clock
from doctor.trace.events import build_timeline
from doctor.trace.window_events import window_events
from tests import chrome_trace
from tests.support import SHARED_TRACES, FakeClock, record_loop, write_record

MB = 2**20


def test_a_long_run_keeps_every_step_and_caps_the_detail(tmp_path: Path) -> None:
    record_loop(tmp_path, 20_000, wait_s=0.002, compute_s=0.01)
    write_record(tmp_path)
    analysis = finalize_run(tmp_path)
    path = tmp_path / "timeline.json.gz"
    data = chrome_trace.load(path)
    events = chrome_trace.check(data)
    steps = [e["name"] for e in events if e["ph"] == "X" and e["cat"] == "step"]
    assert len(steps) == len(set(steps)) == len(analysis.ledger) > 19_000
    by_thread = chrome_trace.slices_by_thread(events)
    assert by_thread["training thread"] == INTERVAL_CAP  # 3 intervals a step, the newest kept
    assert any("newest 10,000 of its 60,000" in n for n in data["otherData"]["capped"])
    assert path.stat().st_size < 4 * MB
    # the kept intervals are the newest: the last step's are there, the first step's are not
    rings = [e for e in events if e["ph"] == "X" and e["cat"] in ("loader_wait", "optimizer")]
    first, last = min(e["ts"] for e in rings), max(e["ts"] for e in rings)
    step_ts = sorted(e["ts"] for e in events if e["ph"] == "X" and e["cat"] == "step")
    assert first > step_ts[len(step_ts) // 2] and last >= step_ts[-1]


def test_steps_carry_their_split_and_marks(tmp_path: Path) -> None:
    record_loop(tmp_path, 40, wait_s=0.03, compute_s=0.01)
    write_record(tmp_path)
    analysis = finalize_run(tmp_path)
    events = chrome_trace.check(chrome_trace.load(tmp_path / "timeline.json.gz"))
    steps = {e["name"]: e for e in events if e["ph"] == "X" and e["cat"] == "step"}
    row = analysis.ledger.iloc[20]
    step = steps[f"step {int(row['step'])}"]
    assert step["dur"] == pytest.approx(row["wall_s"] * 1e6, abs=1)
    assert step["ts"] == pytest.approx(row["start_s"] * 1e6, abs=1)
    assert sum(step["args"]["split_ms"].values()) == pytest.approx(row["wall_s"] * 1e3, rel=1e-3)
    assert step["args"]["analysed"] is True
    assert "warm-up" in steps["step 1"]["args"]["marks"]
    waits = [e for e in events if e["ph"] == "X" and e["name"] == "DataLoader wait"]
    assert len(waits) == 40 and all(e["dur"] == pytest.approx(30_000, abs=1) for e in waits)


def test_the_report_links_to_the_timeline(tmp_path: Path) -> None:
    record_loop(tmp_path, 30)
    write_record(tmp_path)
    finalize_run(tmp_path)
    html = (tmp_path / "report.html").read_text()
    assert 'href="timeline.json.gz"' in html and "ui.perfetto.dev" in html


def _trace_events(ops: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {"ph": "X", "cat": "cpu_op", "name": f"ProfilerStep#{n}", "ts": 1000.0 * n,
         "dur": 1000.0, "pid": 1, "tid": 7} for n in (1, 2, 3)]
    events += [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{i}", "ts": 1000.0 + i * 50,
                "dur": 10.0, "pid": 1, "tid": 7} for i in range(ops)]
    events += [{"ph": "X", "cat": "kernel", "name": "gemm_kernel", "ts": 1100.0 + i * 50,
                "dur": 20.0, "pid": 0, "tid": "stream 7", "args": {"correlation": i}}
               for i in range(ops)]
    return events


def test_window_events_keep_the_newest_and_every_step() -> None:
    frame, total = window_events(build_timeline(_trace_events(50)), cap=10)
    assert total == 103
    steps = frame[frame["kind"] == "step"]
    assert list(steps["name"]) == ["ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"]
    detail = frame[frame["kind"] != "step"]
    assert len(detail) == 10 and detail["start_us"].min() >= 1000.0 + 45 * 50
    assert set(detail["track"]) == {"thread 7", "stream 7"}


def test_window_events_are_put_on_the_process_clock() -> None:
    events = pd.DataFrame({"start_us": [5_000_000.0, 5_100_000.0],  # Unix clock: 5 s, 5.1 s
                           "end_us": [5_000_500.0, 5_200_000.0]})
    # the pair: the session's 1 s is Unix 4 s, so the events are at the session's 2 s and 2.1 s
    moved = on_process_clock(events, {"clock": [10**9, 4 * 10**9]}, (19 * 10**8, 25 * 10**8))
    assert list(moved["t0_ns"]) == [2 * 10**9, 21 * 10**8]
    assert list(moved["t1_ns"]) == [2_000_500_000, 22 * 10**8]
    # no pair (a run recorded before it was kept): the first event at the window's start
    moved = on_process_clock(events, {}, (3 * 10**9, 35 * 10**8))
    assert list(moved["t0_ns"]) == [3 * 10**9, 31 * 10**8]
    # a pair that puts the events far outside the window (a clock stepped): not believed
    assert 25 * 10**8 + CLOCK_SLACK_NS < 5 * 10**9
    moved = on_process_clock(events, {"clock": [0, 0]}, (2 * 10**9, 25 * 10**8))
    assert list(moved["t0_ns"]) == [2 * 10**9, 21 * 10**8]


def test_a_recorded_window_lands_inside_its_steps(tmp_path: Path) -> None:
    """A Session's own clock pair places the trace's events: a fake clock here, so the pair is
    written by hand as the probe writes it."""
    clock = FakeClock()
    record_loop(tmp_path, 30, clock=clock)
    write_record(tmp_path)
    proc = next((tmp_path / "rank-0").iterdir())
    meta = json.loads((proc / "meta.json").read_text())
    unix0 = 1_790_000_000_000_000_000
    meta["window"] = {"state": "done", "clock": [10**12, unix0]}
    (proc / "meta.json").write_text(json.dumps(meta))
    # a trace of two ops at the session's 10**12 ns + 0.5 s and + 0.6 s, on the Unix clock
    trace = {"baseTimeNanoseconds": unix0, "traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": n, "ts": ts, "dur": 100.0, "pid": 1, "tid": 1}
        for n, ts in (("aten::mm", 500_000.0), ("aten::add", 600_000.0))]
        + [{"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#SGD.step",
            "ts": 500_000.0 + 10_000.0 * k, "dur": 50.0, "pid": 1, "tid": 1} for k in range(3)]}
    (proc / "trace.json").write_text(json.dumps(trace))
    finalize_run(tmp_path)
    events = chrome_trace.check(chrome_trace.load(tmp_path / "timeline.json.gz"))
    mm = next(e for e in events if e["name"] == "aten::mm")
    t0_s = 1000.0  # write_record's run start; the fake clock starts at 10**12 ns = 1000 s
    assert mm["ts"] == pytest.approx((10**12 + 500_000_000 - t0_s * 1e9) / 1e3, abs=1)


GPU_TRACES = [SHARED_TRACES / n for n in ("ddp_a100_rank0_of_2_hostbound.json.gz",
                                          "edge/rocm_mi250_toy.json.gz")]


@pytest.mark.parametrize("trace", [t for t in GPU_TRACES if t.is_file()],
                         ids=lambda t: t.name.split(".")[0])
def test_a_gpu_window_nests_on_its_threads_and_streams(tmp_path: Path, trace: Path) -> None:
    """A real GPU trace as a run's window: each thread and stream of it a track of its own,
    every slice nested, the kernels there, and its first event where the clock pair puts it."""
    record_loop(tmp_path, 30)
    write_record(tmp_path)
    proc = next((tmp_path / "rank-0").iterdir())
    from doctor.trace.events import load_timeline

    timeline = load_timeline(trace)
    unix_first_ns = round((timeline.origin_us + (timeline.meta.base_time_ns or 0) / 1e3) * 1e3)
    meta = json.loads((proc / "meta.json").read_text())
    meta["window"] = {"state": "done", "clock": [10**12 + 10**8, unix_first_ns]}
    (proc / "meta.json").write_text(json.dumps(meta))
    (proc / "trace.json.gz").write_bytes(trace.read_bytes())
    events = chrome_trace.check(chrome_trace.load(export_timeline(tmp_path)))
    threads = chrome_trace.names(events, "thread_name")
    window = [e for e in events if e["ph"] == "X"
              and threads[(e["pid"], e["tid"])].startswith("torch.profiler")]
    assert window and any(e["cat"] == "torch.profiler kernel" for e in window)
    assert any("stream" in threads[(e["pid"], e["tid"])] for e in window)
    assert min(e["ts"] for e in window) == pytest.approx(0.1e6, abs=1)  # 0.1 s into the run
    assert len(window) <= 10_000 + len(timeline.steps)


def test_gpu_and_machine_samples_are_counter_tracks_thinned_to_their_cap(tmp_path: Path
                                                                        ) -> None:
    from array import array

    from doctor.analyse.timeline import COUNTER_CAP
    from doctor.store.samples import GPU_COLUMNS, save_gpu

    record_loop(tmp_path, 30)
    write_record(tmp_path)
    n = 2 * (COUNTER_CAP + 500)  # two GPUs, each with more samples than the cap
    columns = {c: array("d", [0.0] * n) for c in GPU_COLUMNS}
    columns["t_s"] = array("d", [i // 2 * 0.1 for i in range(n)])
    columns["gpu"] = array("d", [i % 2 for i in range(n)])
    columns["util_pct"] = array("d", [50.0 + 40 * (i % 2) for i in range(n)])
    save_gpu(tmp_path, columns)
    data = chrome_trace.load(export_timeline(tmp_path))
    events = chrome_trace.check(data)
    procs = chrome_trace.names(events, "process_name")
    util = [e for e in events if e["ph"] == "C" and e["name"] == "utilization %"]
    per_gpu = Counter(procs[e["pid"]] for e in util)
    assert per_gpu == {"GPU 0 (node 0)": COUNTER_CAP, "GPU 1 (node 0)": COUNTER_CAP}
    assert {e["args"]["sm"] for e in util if procs[e["pid"]] == "GPU 1 (node 0)"} == {90.0}
    assert sum("evenly spaced" in note for note in data["otherData"]["capped"]) == 2


def test_the_nodes_of_a_job_are_named_and_said_to_be_aligned_at_their_starts(tmp_path: Path
                                                                             ) -> None:
    from doctor.analyse.timeline import run_timeline
    from doctor.pipeline import analyse
    from doctor.store.reader import load_run

    for node in (0, 1):
        record_loop(tmp_path / f"node-{node}", 30, rank=node)
        write_record(tmp_path / f"node-{node}")
    run = load_run([tmp_path / "node-0", tmp_path / "node-1"])
    timeline = run_timeline(run, analyse(run).ledger)
    mains = [p.name for p in timeline.processes if " main " in p.name]
    assert [m.split(" (")[0] for m in mains] == ["node 0 rank 0 main", "node 1 rank 1 main"]
    assert len({p.pid for p in timeline.processes}) == len(timeline.processes)
    assert any("aligned at their starts" in n for n in timeline.notes)


def test_a_run_of_many_processes_shares_the_run_s_budget(tmp_path: Path) -> None:
    from doctor.analyse.timeline import Caps, run_timeline
    from doctor.pipeline import analyse
    from doctor.store.reader import load_run

    for rank in range(8):
        record_loop(tmp_path, 60, rank=rank)
    write_record(tmp_path)
    run = load_run(tmp_path)
    caps = Caps(detail=2 * 8 * 100, steps=8 * 20)
    timeline = run_timeline(run, analyse(run).ledger, caps)
    mains = [p for p in timeline.processes if " main " in p.name]
    assert len(mains) == 8
    for proc in mains:
        threads = {t.name: sum(len(s.names) for s in t.slices) for t in proc.threads}
        assert threads["training thread"] == 100  # 180 recorded, 1,600 / 16 kept
        assert threads["steps"] == 20  # the newest 20 of 59
    assert sum("newest 20 of its 59 steps" in n for n in timeline.notes) == 8
    full = run_timeline(run, analyse(run).ledger)
    assert all(sum(len(s.names) for t in p.threads if t.name == "steps" for s in t.slices)
               == 59 for p in full.processes if " main " in p.name)


def test_the_window_and_the_sampling_span_each_have_a_track(tmp_path: Path) -> None:
    """Stack sampling starts with the window and outlasts it: on one track they would overlap
    (a viewer draws one of them on the wrong row)."""
    from doctor.record.session import Session
    from doctor.store.records import (
        EVENT_WINDOW_START,
        EVENT_WINDOW_STOP_BEGIN,
        EVENT_WINDOW_STOP_END,
        STEP_OPTIMIZER,
    )
    from doctor.store.stacks import write_stacks

    clock = FakeClock()
    session = Session(tmp_path, rank=0, clock=clock, window_start=10**9)
    marks: dict[str, int] = {}
    for i in range(40):
        if i == 10:
            session.record_event(EVENT_WINDOW_START, 10)
            marks["start"] = clock()
        if i == 15:
            session.record_event(EVENT_WINDOW_STOP_BEGIN, 0)
            clock.tick(0.05)
            session.record_event(EVENT_WINDOW_STOP_END, 0)
        clock.tick(0.01)
        session.record_optimizer_start()
        clock.tick(0.002)
        session.record_optimizer_end(0)
        session.count_step(STEP_OPTIMIZER)
    session.close()
    write_record(tmp_path)
    proc = next((tmp_path / "rank-0").iterdir())
    write_stacks(proc, {("train.py:loop",): 10}, recorder="py-spy", rate_hz=50,
                 start_ns=marks["start"] + 10**6, end_ns=clock(), taken=10)
    events = chrome_trace.check(chrome_trace.load(export_timeline(tmp_path)))
    threads = chrome_trace.names(events, "thread_name")
    by_name = {e["name"]: threads[(e["pid"], e["tid"])] for e in events if e["ph"] == "X"
               and e["cat"] == "doctor"}
    assert by_name == {"deep window (torch.profiler)": "deep window",
                       "closing the window (profiler stop and export)": "deep window",
                       "stack sampling": "stack sampling"}
    steps = [e for e in events if e["ph"] == "X" and e["cat"] == "step"]
    assert any("deep window" in e["args"].get("marks", []) for e in steps)
    assert any("stack sampling" in e["args"].get("marks", []) for e in steps)
