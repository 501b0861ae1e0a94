"""Hours, not minutes (issue 34, item 4): a run far longer than the detailed rings hold still
counts every step in bounded space (the ``run_steps`` buckets, doctor.record.run_steps), its long
stalls are found wherever they fell, and the step chart shows the whole run with its spikes
(reports.step_chart). Sizes are shrunk (a ring of 2,048 records) so the tests stay fast; the
day-long figures are bench/long_run.py's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import doctor.record.session as session_module
from doctor.analyse.causes import UNEXPLAINED
from doctor.analyse.gc_pauses import GC
from doctor.analyse.whole_run import LOST, lost_stalls
from doctor.pipeline import analyze_run
from doctor.record.run_steps import BUCKET_STEPS
from doctor.record.session import STEP_DATALOADER, Session
from doctor.reports import charts
from doctor.reports.step_chart import envelope
from doctor.store import layout
from doctor.store.records import checkpoint_key, gc_key, loader_key
from doctor.store.ringbuffer import read_ring
from tests.support import FakeClock, write_record

CAPACITY = 2048
STEP_S = 0.05
GC_PAUSE_S = 0.9  # 19x the step, under a long stall's second


def record(run_dir: Path, steps: int, stall_at: int, ckpt_every: int = 0, gc_every: int = 0
           ) -> None:
    """A loop of ``steps`` 50 ms steps (wait, backward, optimizer step), one 30 s stall at step
    ``stall_at``, a checkpoint every ``ckpt_every`` steps, a full collection of GC_PAUSE_S
    every ``gc_every``."""
    clock = FakeClock()
    s = Session(run_dir, rank=0, clock=clock, window_start=10**9)
    loader = s.record_loader({"num_workers": 0, "batch_size": 32, "pin_memory": False,
                              "persistent_workers": False})
    for step in range(1, steps + 1):
        t0 = clock()
        clock.tick(0.01)
        s.record_interval("loader_wait", t0, clock(), loader_key(loader))
        s.count_step(STEP_DATALOADER)
        clock.tick(0.015 + (30.0 if step == stall_at else 0.0))
        if gc_every and step % gc_every == 0:
            t0 = clock()
            clock.tick(GC_PAUSE_S)
            s.record_interval("gc", t0, clock(), gc_key(2, 100))
        b0 = clock()
        clock.tick(0.02)
        s.record_interval("backward", b0, clock())
        s.record_optimizer_start()
        clock.tick(0.005)
        s.record_optimizer_end(0)
        if ckpt_every and step % ckpt_every == 0:
            t0 = clock()
            clock.tick(2.0)
            s.record_interval("checkpoint", t0, clock(), checkpoint_key(0, 1 << 30))
    s.close()
    write_record(run_dir, duration_s=steps * STEP_S + 40)


@pytest.fixture
def small_rings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_module, "RING_CAPACITY", CAPACITY)


def test_every_step_is_counted_in_bounded_space(tmp_path: Path, small_rings: None) -> None:
    steps = 60_000  # 29x what a detailed ring holds
    record(tmp_path, steps, stall_at=1_000)
    proc = next(layout.process_dirs(tmp_path))[0]
    buckets, written = read_ring(layout.ring_path(proc, "run_steps"))
    assert written == len(buckets) <= steps // BUCKET_STEPS + 2  # nothing overwritten
    assert int(buckets["steps"].sum()) == steps - 1  # every step after the first boundary
    optimizer, total = read_ring(layout.ring_path(proc, "optimizer"))
    assert total == steps and len(optimizer) == CAPACITY  # the detailed ring kept the newest
    for ring in proc.glob("*.ring"):  # a ring's file never outgrows its capacity
        assert ring.stat().st_size <= 256 + CAPACITY * 56 + 4096
    assert buckets["max_ns"].max() >= 30e9  # the stall is the longest of its bucket


def test_a_stall_the_rings_lost_is_still_found_and_said(tmp_path: Path, small_rings: None) -> None:
    steps = 20_000
    record(tmp_path, steps, stall_at=500, ckpt_every=5_000)
    analysis = analyze_run(tmp_path)
    ledger = analysis.ledger
    assert len(ledger) <= CAPACITY  # the ledger holds the newest steps
    whole = analysis.sections.whole_run
    assert whole is not None and whole.ranks[0].total == steps - 1
    assert whole.lost(0) == steps - 1 - len(ledger)
    stalls = lost_stalls(whole, ledger)
    [stall] = [s for s in stalls if not s.during]
    assert stall.step == 499 and stall.seconds == pytest.approx(30.05, abs=0.01)  # 499: from 1
    assert [s.during for s in stalls if s.during] == ["checkpoint"] * 3  # named, not stalls
    notes = " ".join(analysis.verdict.notes)
    assert f"ran {steps - 1:,} steps" in notes
    assert "3 long step(s) of checkpoint" in notes  # named, and no finding of their own
    [finding] = [f for f in analysis.verdict.findings if f.id == "steps.stall"]
    assert finding.evidence["step"] == 499 and finding.evidence["seconds"] == pytest.approx(30.05)
    assert "About step 499 of the run" in finding.title
    svg = charts.step_time_chart(ledger, whole)
    assert svg is not None
    for gid in ("steps-range", "steps-long-stall", "steps-analysed"):
        assert f'id="{gid}"' in svg


def test_slow_steps_are_grouped_by_cause_over_the_whole_run(tmp_path: Path,
                                                            small_rings: None) -> None:
    """A full collection every 500 of 20,000 steps: the slow steps the rings lost are found in
    the buckets' longest steps and get the collector's cause from its ring (which holds the
    whole run), so the GC finding counts all 40, not the few the ledger holds."""
    steps = 20_000
    record(tmp_path, steps, stall_at=750, gc_every=500)
    analysis = analyze_run(tmp_path)
    slow = analysis.sections.slow_steps
    assert slow is not None
    gc = slow.group(GC)
    assert gc is not None and gc.count == 40
    lost = sorted(s.step for s in gc.steps if s.where == LOST)
    assert 30 <= len(lost) < 40  # the ledger holds the newest 2,048 steps: 4 or 5 pauses
    assert all(abs(n - k * 500) <= 1 for n, k in zip(lost, range(1, 41), strict=False))
    # the shares are of the whole run's steps: 40 pauses over its 20,000 steps
    whole_s = steps * STEP_S + 40 * GC_PAUSE_S + 30
    assert gc.steps_share == pytest.approx(40 * GC_PAUSE_S / whole_s, rel=0.05)
    [stall] = [s for s in slow.steps if s.cause == UNEXPLAINED]
    assert stall.where == LOST and stall.step == 749 and stall.stall
    finding = next(f for f in analysis.verdict.findings if f.id == "steps.gc")
    assert finding.title.startswith("40 slow steps paused by Python's garbage collector")
    # a lost step's number is the whole run's: never taken for a ledger step of that number
    assert slow.cause_of(0, 749) is None


def test_a_run_the_rings_hold_whole_is_drawn_from_its_ledger(tmp_path: Path) -> None:
    record(tmp_path, 400, stall_at=200, ckpt_every=100)
    analysis = analyze_run(tmp_path)
    whole = analysis.sections.whole_run
    assert whole is not None and not whole.partial()
    assert whole.ranks[0].total == len(analysis.ledger) == 399
    svg = charts.step_time_chart(analysis.ledger, whole)
    assert svg is not None and 'id="steps-range"' not in svg
    assert 'id="steps-slow-step"' in svg and 'id="steps-phase-checkpoints"' in svg


def test_one_spike_among_a_million_steps_survives_the_folding() -> None:
    n = 1_000_000
    rng = np.random.default_rng(0)
    wall = 0.05 + 0.002 * rng.random(n)
    wall[654_321] = 30.0
    env = envelope(np.arange(1, n + 1), wall, {"compute": wall * 0.8})
    assert env.folded and len(env.step) <= 300
    assert env.high.max() == 30.0  # kept, in the bucket that holds step 654,322
    spike = int(np.argmax(env.high))
    assert env.step[spike] <= 654_322 < env.step[spike + 1]
    assert np.all(env.mid < 0.053)  # the median is not pulled up by it
    assert np.all(env.low >= 0.05)


def test_the_run_steps_of_a_process_that_restarts_its_count(tmp_path: Path) -> None:
    """A stronger kind of boundary appears (DataLoader batches, then optimizer steps): the
    bucket closes, and the buckets after it count the new kind."""
    clock = FakeClock()
    s = Session(tmp_path, rank=0, clock=clock, window_start=10**9)
    for _ in range(10):
        clock.tick(0.1)
        s.count_step(STEP_DATALOADER)
    for _ in range(300):
        s.record_optimizer_start()
        clock.tick(0.1)
        s.record_optimizer_end(0)
    s.close()
    write_record(tmp_path)
    from doctor.store.reader import load_run

    run = load_run(tmp_path)
    kinds = run.run_steps["kind"].to_list()
    assert kinds[0] == STEP_DATALOADER and set(kinds[1:]) == {2}
    assert int(run.run_steps["steps"].sum()) == 9 + 299
