"""The bound on a trace's events (doctor.trace.budget): past it, the first steps are kept whole,
whatever order the file writes the events in, the later ones are left out, and the verdict says
how many of how many steps it analysed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from doctor.trace import budget, reader
from doctor.trace.events import Timeline, load_timeline
from doctor.trace.parallel import load_timeline_parallel
from tests.trace_files import KINDS, assert_same_timeline, write_events

STEP_US = 1000


def kineto_order(steps: int, ops_per_step: int) -> list[dict[str, Any]]:
    """A GPU trace as Kineto writes it: every host event (steps, ops, launches) first, then
    every kernel, so the events of a step are far apart in the file."""
    host: list[dict[str, Any]] = []
    gpu: list[dict[str, Any]] = []
    for s in range(steps):
        t0 = s * STEP_US
        host.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s + 1}",
                     "ts": t0, "dur": STEP_US - 1, "tid": 1})
        for k in range(ops_per_step):
            corr = s * ops_per_step + k
            at = t0 + 1 + k * (STEP_US - 20) // ops_per_step
            host.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": at, "dur": 3,
                         "tid": 1})
            host.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                         "ts": at + 1, "dur": 1, "tid": 1, "args": {"correlation": corr}})
            gpu.append({"ph": "X", "cat": "kernel", "name": "volta_sgemm_128x64_nn",
                        "ts": at + 5, "dur": 4, "tid": "stream 7",
                        "args": {"correlation": corr}})
    return host + gpu


def before(t: Timeline, cutoff_us: float) -> dict[str, int]:
    return {kind: int((getattr(t, kind).start < cutoff_us).sum()) for kind in KINDS}


@pytest.mark.parametrize("parallel", [False, True])
def test_past_the_budget_the_first_steps_are_kept_whole(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        parallel: bool) -> None:
    monkeypatch.setattr(reader, "BLOCK_CHARS", 4096)  # many blocks: the cut is made as they come
    path = write_events(tmp_path / "t.json", kineto_order(steps=20, ops_per_step=30))
    whole = load_timeline(path, max_events=10**9)
    assert whole.cut is None and len(whole.steps) == 20
    cut = load_timeline_parallel(path, 2, max_events=1000) if parallel else \
        load_timeline(path, max_events=1000)  # 90 events a step: 8 fit in 3/4
    assert cut.cut is not None
    kept = cut.cut.kept_steps
    assert (cut.cut.steps, [n for n, _, _ in cut.steps]) == (20, list(range(1, kept + 1)))
    assert 1 < kept <= 10 and cut.cut.kept_events <= 1000
    end = cut.steps[-1][2]
    # every event of the kept steps, host and GPU alike (written far apart), and no other
    assert before(cut, end + 1) == before(whole, end + 1)
    assert len(cut.kernels) == kept * 30 and len(cut.host_ops) == kept * 30
    assert cut.cut.left_out_events + cut.cut.kept_events == 20 * 90  # steps are not counted
    assert "first" in cut.cut.note() and "of 20 steps" in cut.cut.note()


def test_one_step_larger_than_the_budget_is_kept_whole(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader, "BLOCK_CHARS", 4096)
    path = write_events(tmp_path / "t.json", kineto_order(steps=5, ops_per_step=100))
    cut = load_timeline(path, max_events=150)
    assert cut.cut is not None and cut.cut.kept_steps == 1
    assert len(cut.kernels) == 100 and [n for n, _, _ in cut.steps] == [1]


def test_under_the_budget_nothing_is_left_out(tmp_path: Path) -> None:
    path = write_events(tmp_path / "t.json", kineto_order(steps=5, ops_per_step=10))
    small = load_timeline(path, max_events=5 * 31)
    assert small.cut is None
    assert_same_timeline(small, load_timeline(path, max_events=10**9))


def test_the_verdict_says_what_it_left_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    from doctor.pipeline import analyze_traces

    monkeypatch.setattr(budget, "MAX_EVENTS", 1000)
    monkeypatch.setattr(reader, "BLOCK_CHARS", 4096)
    path = write_events(tmp_path / "t.json", kineto_order(steps=20, ops_per_step=30))
    verdict = analyze_traces([path]).verdict
    [note] = [n for n in verdict.notes if "events:" in n]
    assert "of 20 steps are analysed" in note and "memory stays bounded" in note
    assert verdict.probes["trace"].ok
    assert json.loads(json.dumps(verdict.steps))["count"] < 20
    assert np.isfinite(verdict.shares["compute"])
