"""The page-faults probe (issue 32, item 10): the training process's minor page faults over a
few steps just before the profiler window and a few just after it, into the page_faults ring,
and what the analysis makes of them (doctor.analyse.window_drift): counts from the kernel, not
wall-clock times."""

from __future__ import annotations

import mmap
from collections.abc import Callable
from pathlib import Path

from doctor.analyse.steps import training_processes
from doctor.analyse.window_drift import fault_rates, window_drift
from doctor.pipeline import analyze_run
from doctor.probes.page_faults import SKIP, SPAN, PageFaultsProbe
from doctor.record.session import (
    EVENT_WINDOW_START,
    EVENT_WINDOW_STOP_BEGIN,
    EVENT_WINDOW_STOP_END,
    STEP_OPTIMIZER,
    WINDOW_END,
    Session,
)
from doctor.store.reader import load_run
from tests.support import FakeClock, write_record

START, STEPS = 8, 5


def run_loop(run_dir: Path, step: Callable[[int], None], steps: int = 30,
             clock: FakeClock | None = None, faults: object = None, before_s: float = 0.1,
             after_s: float = 0.1) -> PageFaultsProbe:
    """Steps counted by a real Session, a window from step START for STEPS steps (its events,
    and WINDOW_END as the profiler window emits it), ``step(i)`` run in each step."""
    clock = clock or FakeClock()
    session = Session(run_dir, rank=0, clock=clock, window_start=START, window_steps=STEPS)
    probe = PageFaultsProbe(session, faults)
    assert probe.check().ok
    probe.start()

    def window(count: int) -> None:  # what doctor.probes.torch_ops does, on its step listener
        if count == START:
            session.record_event(EVENT_WINDOW_START)
        elif count == START + STEPS:
            session.record_event(EVENT_WINDOW_STOP_BEGIN)
            session.record_event(EVENT_WINDOW_STOP_END)
            session.emit(WINDOW_END)

    session.on_step(window)
    for i in range(steps):
        step(i)
        clock.tick(before_s if i < START else after_s)
        session.record_optimizer_start()
        session.record_optimizer_end(0)
    session.close()
    write_record(run_dir, t0_monotonic_s=0.0)
    return probe


def test_the_spans_before_and_after_the_window(tmp_path: Path) -> None:
    faults = iter(range(0, 10**6, 1000))  # 1000 faults between two reads
    probe = run_loop(tmp_path, lambda i: None, faults=lambda: next(faults))
    [before, after] = probe.spans
    assert before[2] == after[2] == 1000
    # the before-span ends as the window opens; the after-span starts SKIP steps after it closed
    run = load_run(tmp_path)
    ranks = training_processes(run)
    t0, t1, counts = run.intervals_of(ranks[0].process, "page_faults")
    assert list(counts) == [1000, 1000]
    assert t1[0] <= ranks[0].window_ns[0] < t0[1]
    assert fault_rates(run, ranks) == {0: (1000 / SPAN, 1000 / SPAN)}
    assert SKIP >= 1


def test_real_faults_of_fresh_memory_before_the_window_only(tmp_path: Path) -> None:
    """A step that touches 4 MiB of fresh mapped memory before the window (what a large tensor
    costs while glibc maps it anew) and nothing after: the faults say so."""
    def step(i: int) -> None:
        if i < START:
            m = mmap.mmap(-1, 4 << 20)
            for off in range(0, len(m), mmap.PAGESIZE):
                m[off] = 1
            m.close()

    probe = run_loop(tmp_path, step)
    [before, after] = probe.spans
    assert before[2] >= SPAN * 1024 * 0.9  # a fault per 4 KiB page, every step
    assert after[2] < before[2] / 4
    [drift] = window_drift(analyze_run(tmp_path).ledger, fault_rates(
        load_run(tmp_path), training_processes(load_run(tmp_path))))
    assert drift.allocator is True


def test_faster_steps_with_unchanged_faults_are_not_the_allocator(tmp_path: Path) -> None:
    faults = iter(range(0, 10**6, 2000))  # as many faults a step before as after
    run_loop(tmp_path, lambda i: None, faults=lambda: next(faults), before_s=0.1, after_s=0.07)
    analysis = analyze_run(tmp_path)
    [drift] = window_drift(analysis.ledger, fault_rates(load_run(tmp_path),
                                                        training_processes(load_run(tmp_path))))
    assert drift.faster and drift.allocator is False
    assert "allocator.page_faults" not in [f.id for f in analysis.verdict.findings]
    assert any("not the allocator" in n for n in analysis.verdict.notes)


def test_faster_steps_with_the_faults_gone_are_the_allocator(tmp_path: Path) -> None:
    reads = iter([0, 0, 40_000, 40_100, 40_200])  # check() reads once; 10 000 a step before
    run_loop(tmp_path, lambda i: None, faults=lambda: next(reads), before_s=0.1, after_s=0.07)
    analysis = analyze_run(tmp_path)
    finding = next(f for f in analysis.verdict.findings if f.id == "allocator.page_faults")
    assert finding.evidence["page_faults_per_step_before_window"] == 10_000
    assert "likely" not in finding.title


def test_off_without_a_window(tmp_path: Path) -> None:
    session = Session(tmp_path, rank=0, window_start=0, window_steps=0)
    assert not PageFaultsProbe(session).check().ok
    early = Session(tmp_path, rank=0, window_start=3, window_steps=5)
    assert not PageFaultsProbe(early).check().ok
    assert STEP_OPTIMIZER  # the kind the loop above counts
