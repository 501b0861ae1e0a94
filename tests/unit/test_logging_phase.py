"""Logging and metrics as a phase (issue 34, item 1): the logging probe's counts and its long
calls from a recorded loop (a real Session on a FakeClock; Python's logging with a handler that
takes the clock forward, and a SummaryWriter stand-in in TensorBoard's module), the phase's
count, time and share, its finding and fixes, and the training verdict kept."""

from __future__ import annotations

import logging
import sys
import threading
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from doctor.analyse.phases import LOGGING
from doctor.pipeline import analyze_run
from doctor.probes.logging_calls import LoggingProbe
from doctor.record.session import Session
from doctor.reports.json import verdict_data
from doctor.reports.text import render_text
from tests.support import FakeClock, write_record

STEP_S, EMIT_S, SCALAR_S, FLUSH_S = 0.1, 0.05, 0.0002, 0.2
WRITER_MODULE = "torch.utils.tensorboard.writer"


class SlowHandler(logging.Handler):
    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock

    def emit(self, record: logging.LogRecord) -> None:
        self.clock.tick(EMIT_S)


@pytest.fixture
def writer_module(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """A stand-in for torch.utils.tensorboard.writer (tensorboard is not installed here)."""
    module = types.ModuleType(WRITER_MODULE)

    class SummaryWriter:
        def __init__(self, clock: FakeClock) -> None:
            self.clock = clock

        def add_scalar(self, tag: str, value: float, step: int) -> None:
            self.clock.tick(SCALAR_S)

        def flush(self) -> None:
            self.clock.tick(FLUSH_S)

    module.SummaryWriter = SummaryWriter  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, WRITER_MODULE, module)
    yield module


def logged_loop(run_dir: Path, module: types.ModuleType | None, steps: int = 60,
                every: int = 10, flush_every: int = 20) -> dict[str, float]:
    """Optimizer steps of STEP_S; every ``every`` steps a log record (its handler EMIT_S) and a
    scalar (SCALAR_S), every ``flush_every`` a flush (FLUSH_S); what the loop logged."""
    clock = FakeClock()
    session = Session(run_dir, rank=0, clock=clock, window_start=10**9)
    probe = LoggingProbe(session)
    original = logging.Logger.callHandlers
    probe.start()
    logger = logging.getLogger("doctor-test-train")
    logger.propagate = False
    handler = SlowHandler(clock)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    writer = module.SummaryWriter(clock) if module is not None else None  # type: ignore[attr-defined]
    done = {"calls": 0.0, "seconds": 0.0}
    try:
        for i in range(1, steps + 1):
            clock.tick(STEP_S)
            logger.debug("filtered out: never reaches a handler, never counted")
            if module is not None and i % every == 0:
                logger.info("step %d", i)
                writer.add_scalar("loss", 1.0, i)
                done["calls"] += 2
                done["seconds"] += EMIT_S + SCALAR_S
                if i % flush_every == 0:
                    writer.flush()
                    done["calls"] += 1
                    done["seconds"] += FLUSH_S
            session.record_optimizer_start()
            session.record_optimizer_end(0)
        other = threading.Thread(target=logger.info, args=("from another thread",))
        other.start()
        other.join()
    finally:
        logger.removeHandler(handler)
        session.close()
        probe.stop()
    assert logging.Logger.callHandlers is original  # put back as the probe stops
    write_record(run_dir, t0_monotonic_s=0.0)
    return done


def test_logging_calls_are_a_phase_with_their_count_time_and_share(
        tmp_path: Path, writer_module: types.ModuleType) -> None:
    done = logged_loop(tmp_path, writer_module)
    analysis = analyze_run(tmp_path)
    [phase] = [p for p in analysis.sections.phases if p.kind == LOGGING]
    # every call on the training thread, short ones too; the other thread's is not the loop's
    assert phase.count == done["calls"] == 15
    assert phase.seconds == pytest.approx(done["seconds"], rel=1e-6)
    whole = 60 * STEP_S + done["seconds"]
    assert phase.share == pytest.approx(done["seconds"] / whole, rel=0.05)
    assert phase.libraries == "logging, tensorboard"
    # the steps a log took a tenth of or more are the phase's, out of the training shares
    assert set(phase.steps) == {9, 19, 29, 39, 49, 59}  # a step ends at its optimizer step
    finding = next(f for f in analysis.verdict.findings if f.id == "phases.logging")
    assert finding.title.startswith("Logging: 15 calls (logging, tensorboard), 0.90 s")
    assert [f.title for f in finding.fixes] == [
        "Log every N steps, and read the loss once per log", "Write logs from a background thread"]
    assert finding.estimated_speedup == pytest.approx(whole / (whole - done["seconds"] / 2),
                                                      rel=0.05)
    assert analysis.verdict.bottleneck == "compute"
    assert "logging, rank 0: 15 calls (logging, tensorboard)" in render_text(analysis)
    data = [p for p in verdict_data(analysis)["phases"] if p["phase"] == LOGGING]
    assert data[0]["count"] == 15 and data[0]["libraries"] == "logging, tensorboard"


def test_the_logged_steps_leave_the_training_shares_as_without_logging(
        tmp_path: Path, writer_module: types.ModuleType) -> None:
    logged_loop(tmp_path / "logged", writer_module)
    logged_loop(tmp_path / "quiet", None)
    logged, quiet = analyze_run(tmp_path / "logged"), analyze_run(tmp_path / "quiet")
    assert logged.verdict.bottleneck == quiet.verdict.bottleneck
    assert logged.verdict.steps["median_s"] == pytest.approx(quiet.verdict.steps["median_s"])
    assert not [p for p in quiet.sections.phases if p.kind == LOGGING]
    assert not [f for f in quiet.verdict.findings if f.id == "phases.logging"]


def test_short_calls_only_are_counted_with_nothing_written(tmp_path: Path) -> None:
    """Calls under a millisecond: counted and timed, no ring record, no step marked."""
    clock = FakeClock()
    session = Session(tmp_path, rank=0, clock=clock, window_start=10**9)
    probe = LoggingProbe(session)
    probe.start()
    logger = logging.getLogger("doctor-test-short")
    logger.propagate = False
    handler = logging.NullHandler()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        for i in range(30):
            clock.tick(STEP_S)
            logger.info("step %d", i)
            session.record_optimizer_start()
            session.record_optimizer_end(0)
    finally:
        logger.removeHandler(handler)
        session.close()
        probe.stop()
    write_record(tmp_path, t0_monotonic_s=0.0)
    assert probe.calls[0] == 30 and probe.written == 0
    analysis = analyze_run(tmp_path)
    [phase] = [p for p in analysis.sections.phases if p.kind == LOGGING]
    assert phase.count == 30 and phase.steps == () and phase.seconds == 0.0
    assert not [f for f in analysis.verdict.findings if f.id == "phases.logging"]
