"""A training step captured whole as a CUDA graph and replayed (no optimizer step, no backward()
in Python after the capture): the replays are the steps, for the window's count and for the
analysis. A graph of a part of the step (torch.compile's reduce-overhead) is not."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from doctor.pipeline import analyze_run
from doctor.probes.steps import StepsProbe
from doctor.record.session import (
    STEP_BACKWARD,
    STEP_DATALOADER,
    STEP_GRAPH,
    STEP_OPTIMIZER,
    Session,
)
from doctor.record.step_count import GRAPH_TAKEOVER
from tests.support import FakeClock, write_record


def optimizer_step(s: Session, clock: FakeClock, seconds: float) -> None:
    s.count_step(STEP_DATALOADER)
    clock.tick(seconds / 2)
    b0 = clock()
    clock.tick(seconds / 4)
    s.record_interval("backward", b0, clock())
    s.count_step(STEP_BACKWARD)
    s.record_optimizer_start()
    clock.tick(seconds / 4)
    s.record_optimizer_end(0)


def replay(s: Session, clock: FakeClock, seconds: float) -> None:
    t0 = clock()
    clock.tick(seconds)
    s.record_graph_replay(t0)


def whole_step_graph(run_dir: Path, replays: int, step_s: float = 0.002) -> Session:
    """Warm-up and capture: 4 eager steps (0.02 s each); then the graph replays, a DataLoader
    batch before each."""
    clock = FakeClock()
    s = Session(run_dir, clock=clock, window_start=10**9)
    for _ in range(4):
        optimizer_step(s, clock, 0.02)
    for _ in range(replays):
        s.count_step(STEP_DATALOADER)
        replay(s, clock, step_s)
    s.close()
    return s


def partial_graphs(run_dir: Path, steps: int) -> Session:
    """Forward and backward replayed as graphs, the optimizer stepping in Python each step."""
    clock = FakeClock()
    s = Session(run_dir, clock=clock, window_start=10**9)
    for _ in range(steps):
        replay(s, clock, 0.004)
        b0 = clock()
        replay(s, clock, 0.004)
        s.record_interval("backward", b0, clock())
        s.count_step(STEP_BACKWARD)
        s.record_optimizer_start()
        clock.tick(0.002)
        s.record_optimizer_end(0)
    s.close()
    return s


def test_the_window_counts_replays_once_they_are_the_whole_step(tmp_path: Path) -> None:
    counts: list[int] = []
    clock = FakeClock()
    s = Session(tmp_path, clock=clock, window_start=10**9)
    s.on_step(counts.append)
    for _ in range(4):
        optimizer_step(s, clock, 0.02)
    assert s._counter.kind == STEP_OPTIMIZER
    for _ in range(GRAPH_TAKEOVER + 9):
        s.count_step(STEP_DATALOADER)
        replay(s, clock, 0.002)
    assert s._counter.kind == STEP_GRAPH
    assert counts[-10:] == list(range(1, 11))  # counting from the takeover
    optimizer_step(s, clock, 0.02)  # an eager step again: the optimizer counts again
    assert s._counter.kind == STEP_OPTIMIZER and counts[-1] == 1
    s.close()


def test_replays_between_optimizer_steps_never_count(tmp_path: Path) -> None:
    counts: list[int] = []
    clock = FakeClock()
    s = Session(tmp_path, clock=clock, window_start=10**9)
    s.on_step(counts.append)
    for _ in range(4):  # gradient accumulation over 4 micro-batches, 2 graphs each
        for _ in range(GRAPH_TAKEOVER // 8):
            replay(s, clock, 0.001)
            replay(s, clock, 0.001)
        s.record_optimizer_start()
        s.record_optimizer_end(0)
    assert s._counter.kind == STEP_OPTIMIZER
    assert counts[-4:] == [1, 2, 3, 4]
    s.close()


def test_the_analysis_takes_the_replays_as_steps(tmp_path: Path) -> None:
    whole_step_graph(tmp_path, 200)
    write_record(tmp_path)
    verdict = analyze_run(tmp_path).verdict.to_dict()
    assert verdict["steps"]["count"] >= 190  # not the 4 eager steps of the capture
    assert abs(verdict["steps"]["median_s"] - 0.002) < 0.0005


def test_the_analysis_keeps_optimizer_steps_beside_partial_graphs(tmp_path: Path) -> None:
    partial_graphs(tmp_path, 60)
    write_record(tmp_path)
    verdict = analyze_run(tmp_path).verdict.to_dict()
    assert 55 <= verdict["steps"]["count"] <= 60
    assert abs(verdict["steps"]["median_s"] - 0.010) < 0.001


class FakeGraph:
    def __init__(self) -> None:
        self.replays = 0

    def replay(self) -> str:
        self.replays += 1
        return "replayed"


def test_the_probe_records_each_replay_and_restores_the_class(tmp_path: Path) -> None:
    s = Session(tmp_path, clock=FakeClock(), window_start=10**9)
    probe = StepsProbe(s)
    original = FakeGraph.replay
    fake_torch: Any = SimpleNamespace(cuda=SimpleNamespace(CUDAGraph=FakeGraph))
    probe._wrap_graph_replay(fake_torch)
    graph = FakeGraph()
    assert [graph.replay() for _ in range(3)] == ["replayed"] * 3
    assert graph.replays == 3
    assert s._counter.replays_in_a_row == 3
    probe.stop()
    assert FakeGraph.replay is original
    s.close()
