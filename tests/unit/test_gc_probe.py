"""The GC probe (issue 34, item 2): each collection of Python's garbage collector timed through
``gc.callbacks``, full ones (and long young ones) into the ``gc`` ring, every one counted into
meta.json as the process closes; never raising into the collection, and a forked child counting
its own. One test here has the real collector call the probe back (in this process, no sleep)."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from doctor.analyse.steps import training_processes
from doctor.pipeline import analyze_run
from doctor.probes.gc_pauses import WRITTEN_NS, GcProbe
from doctor.record.guard import GUARD_HINT
from doctor.record.session import CLOSE, STEP_MANUAL, Session
from doctor.store.reader import load_run
from doctor.store.records import GC_COLLECTED_MAX, gc_key, gc_key_parts
from tests.support import FakeClock, write_record


def collect(probe: GcProbe, clock: FakeClock, generation: int, seconds: float,
            collected: int = 10) -> None:
    """One collection as gc.callbacks reports it, taking ``seconds`` on the fake clock."""
    probe._callback("start", {"generation": generation})
    clock.tick(seconds)
    probe._callback("stop", {"generation": generation, "collected": collected,
                             "uncollectable": 0})


def test_full_and_long_collections_are_written_the_rest_counted(tmp_path: Path) -> None:
    clock = FakeClock()
    session = Session(tmp_path, rank=0, clock=clock, window_start=10**9)
    probe = GcProbe(session)
    collect(probe, clock, 0, 0.001)  # before the process records anything: counted only
    session.mark_step(STEP_MANUAL)
    collect(probe, clock, 0, 20e-6)  # young and short: counted only
    collect(probe, clock, 1, WRITTEN_NS * 1e-9)  # young but long: written
    collect(probe, clock, 2, 0.3, collected=123_456)  # full: written
    session.mark_step(STEP_MANUAL)
    session.on(CLOSE, probe._close)  # what start() adds, without the real collector's calls
    session.close()
    assert probe.collections == [2, 1, 1] and probe.written == 2
    write_record(tmp_path, t0_monotonic_s=0.0)
    run = load_run(tmp_path)
    main = training_processes(run)[0]
    t0, t1, key = run.intervals_of(main.process, "gc")
    assert [gc_key_parts(int(k)) for k in key] == [(1, 10), (2, 123_456)]
    assert np.allclose((t1 - t0) * 1e-9, [0.001, 0.3])
    proc = run.processes.iloc[0]
    assert (proc["gc_collections"], proc["gc_full"]) == (4, 1)
    assert abs(proc["gc_pause_s"] - (0.001 + 20e-6 + 0.001 + 0.3)) < 1e-9
    assert proc["gc_longest_s"] == pytest.approx(0.3)


def test_the_longest_pause_counts_a_full_collection_before_the_ring(tmp_path: Path) -> None:
    """A full collection of 80 ms during the imports, before the process records anything,
    is not written to the ring, but it is the longest pause (it read "longest pause 0 ms")."""
    from doctor.analyse.gc_pauses import gc_summaries
    from doctor.analyse.step_table import step_table

    clock = FakeClock()
    session = Session(tmp_path, rank=0, clock=clock, window_start=10**9)
    probe = GcProbe(session)
    collect(probe, clock, 2, 0.08)
    for _ in range(6):
        session.mark_step(STEP_MANUAL)
        collect(probe, clock, 0, 20e-6)
        clock.tick(0.01)
    session.on(CLOSE, probe._close)
    session.close()
    assert probe.written == 0
    write_record(tmp_path, t0_monotonic_s=0.0)
    run = load_run(tmp_path)
    ranks = training_processes(run)
    [summary] = gc_summaries(run, ranks, step_table(run, ranks), None).values()
    assert summary.longest_s == pytest.approx(0.08) and summary.full == 1


def test_the_real_collector_calls_the_probe_back(tmp_path: Path) -> None:
    """Cyclic garbage collected by the real collector (gc.collect() is a full collection, as
    the automatic ones are once the heap has grown): recorded, with what it freed."""
    session = Session(tmp_path, rank=0, window_start=10**9)
    probe = GcProbe(session)
    assert probe.check().ok
    probe.start()
    try:
        session.mark_step(STEP_MANUAL)
        for _ in range(3):
            garbage: list[Any] = []
            for _ in range(20_000):
                node: list[Any] = [garbage]
                garbage.append(node)
            del garbage, node
            gc.collect()
        young = [[i] for i in range(50_000)]  # enough allocations for the young generation
        del young
        session.mark_step(STEP_MANUAL)
    finally:
        session.close()
        probe.stop()
    assert probe._callback not in gc.callbacks
    assert probe.collections[2] >= 3 and probe.collections[0] >= 1
    write_record(tmp_path, t0_monotonic_s=0.0)
    run = load_run(tmp_path)
    _t0, _t1, key = run.intervals_of(training_processes(run)[0].process, "gc")
    full = [gc_key_parts(int(k)) for k in key if gc_key_parts(int(k))[0] == 2]
    assert len(full) >= 3 and all(freed >= 20_000 for _, freed in full[-3:])


def test_a_failure_is_said_never_raised(tmp_path: Path) -> None:
    session = Session(tmp_path, rank=0, clock=FakeClock(), window_start=10**9)
    probe = GcProbe(session)
    probe._callback("start", {})
    probe._callback("stop", {})  # no generation: a KeyError caught
    status = session.probe_status["gc"]
    assert status["hint"] == GUARD_HINT and "KeyError" in status["reason"]


def test_a_forked_child_counts_its_own(tmp_path: Path) -> None:
    clock = FakeClock()
    session = Session(tmp_path, rank=0, clock=clock, window_start=10**9)
    probe = GcProbe(session)
    collect(probe, clock, 2, 0.1)
    session.forked()
    session.pid += 1  # what forked() reads from os.getpid() in a real child
    collect(probe, clock, 0, 1e-5)
    assert probe.collections == [1, 0, 0] and probe.written == 0


def test_the_key_holds_generation_and_objects() -> None:
    assert gc_key_parts(gc_key(2, 1_000_000)) == (2, 1_000_000)
    assert gc_key_parts(gc_key(1, 10**12)) == (1, GC_COLLECTED_MAX)
    assert gc_key(2, GC_COLLECTED_MAX) < 2**31


def test_counts_of_another_type_read_as_unknown() -> None:
    from doctor.store.meta_rows import gc_totals

    unknown = {"gc_collections": None, "gc_full": None, "gc_pause_s": None, "gc_longest_s": None}
    assert gc_totals({"collections": [1, "x", 2], "pause_ns": [1, 2, 3]}) == unknown
    assert gc_totals({"collections": [1, 2, 3], "pause_ns": [1, 2]}) == unknown
    assert gc_totals("not a record") == unknown
    assert gc_totals({"collections": [5, 2, 1], "pause_ns": [10**6, 0, 10**8]}) == {
        "gc_collections": 8.0, "gc_full": 1.0, "gc_pause_s": 0.101, "gc_longest_s": None}
    assert gc_totals({"collections": [1], "pause_ns": [5], "longest_ns": 5})["gc_longest_s"] \
        == pytest.approx(5e-9)


def test_a_run_recorded_without_the_probe_does_not_list_it(tmp_path: Path) -> None:
    """An older doctor's run: its processes said every probe's status but this one's; the
    probe table leaves it out (rather than "no status recorded"), as before the probe."""
    for name, statuses in (("old", {"steps": {"ok": True}}),
                           ("new", {"steps": {"ok": True}, "gc": {"ok": True}})):
        clock = FakeClock()
        session = Session(tmp_path / name, rank=0, clock=clock, window_start=10**9)
        session.probe_status = statuses
        for _ in range(20):
            clock.tick(0.01)
            session.record_optimizer_start()
            session.record_optimizer_end(0)
        session.close()
        write_record(tmp_path / name, t0_monotonic_s=0.0)
    assert "gc" not in analyze_run(tmp_path / "old").verdict.probes
    assert analyze_run(tmp_path / "new").verdict.probes["gc"].ok
