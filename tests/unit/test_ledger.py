from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from doctor.analyse.ledger import build_ledger
from doctor.analyse.step_table import step_table, warmup_steps
from doctor.analyse.steps import RankSteps, training_processes
from doctor.analyse.window import WindowSplit
from doctor.categories import CATEGORIES
from doctor.record.session import EVENT_WINDOW_START, EVENT_WINDOW_STOP_BEGIN, EVENT_WINDOW_STOP_END
from doctor.store.reader import load_run
from tests.support import FakeClock, record_loop, write_record


def ledger_of(run_dir: Path, fractions: dict[int, dict[str, float]] | None = None,
              **kwargs: Any) -> tuple[list[RankSteps], pd.DataFrame]:
    """The training processes of a recorded run and its ledger, with the window ``fractions``
    of each rank (a CPU job's) and the other stages' measurements given."""
    if not (run_dir / "run.json").exists():
        write_record(run_dir, t0_monotonic_s=0.0)
    run = load_run(run_dir)
    ranks = training_processes(run)
    windows = {rank: WindowSplit(f, "cpu", f.get("compute", 0.0))
               for rank, f in (fractions or {}).items()}
    return list(ranks.values()), build_ledger(step_table(run, ranks), windows, **kwargs)




def test_unsplit_input_wait_stays_whole_and_the_rest_is_compute(tmp_path: Path) -> None:
    record_loop(tmp_path, 40, wait_s=0.08, compute_s=0.02)
    ranks, ledger = ledger_of(tmp_path)
    assert ranks[0].kind == "optimizer"
    steady = ledger[ledger["analyzed"]]
    total = steady["wall_s"].sum()
    assert steady["input"].sum() / total == pytest.approx(0.8, abs=0.01)
    assert steady["preprocess"].sum() == 0
    assert steady["compute"].sum() / total == pytest.approx(0.2, abs=0.01)
    assert np.allclose(steady[[*CATEGORIES, "input"]].sum(axis=1), steady["wall_s"])


def test_communication_contention_moves_to_communication(tmp_path: Path) -> None:
    record_loop(tmp_path, 40, wait_s=0.0, compute_s=0.1)
    split = {0: {"compute": 0.5, "communication": 0.5}}
    _, plain = ledger_of(tmp_path, split)
    _, moved = ledger_of(tmp_path, split, comm_contention={0: 0.2})
    steady, before = moved[moved["analyzed"]], plain[plain["analyzed"]]
    total = steady["wall_s"].sum()
    # a fifth of the rest waited for a core gloo held: communication, the rest split as before
    assert steady["comm_contention_s"].sum() / total == pytest.approx(0.2, abs=0.01)
    assert steady["communication"].sum() / total == pytest.approx(0.2 + 0.8 * 0.5, abs=0.01)
    assert steady["compute"].sum() / total == pytest.approx(0.8 * 0.5, abs=0.01)
    assert before["communication"].sum() / before["wall_s"].sum() == pytest.approx(0.5, abs=0.01)
    assert np.allclose(steady[list(CATEGORIES)].sum(axis=1), steady["wall_s"])


def test_input_wait_is_split_by_the_measured_stages(tmp_path: Path) -> None:
    record_loop(tmp_path, 40, wait_s=0.08, compute_s=0.02)
    _, ledger = ledger_of(tmp_path, input_split={0: {"io": 0.25, "decode": 0.75}})
    steady = ledger[ledger["analyzed"]]
    total = steady["wall_s"].sum()
    assert steady["io"].sum() / total == pytest.approx(0.2, abs=0.01)
    assert steady["decode"].sum() / total == pytest.approx(0.6, abs=0.01)
    assert steady["input"].sum() == 0
    assert np.allclose(steady[list(CATEGORIES)].sum(axis=1), steady["wall_s"])


def test_input_built_outside_a_loader_comes_out_of_other_first(tmp_path: Path) -> None:
    record_loop(tmp_path, 40, wait_s=0.0, compute_s=0.1)
    # the window saw 50 % other: the batch building (40 %) is part of it
    _, ledger = ledger_of(tmp_path, {0: {"compute": 0.5, "other": 0.5}},
                          outside={0: {"preprocess": 0.3, "io": 0.1}})
    steady = ledger[ledger["analyzed"]]
    total = steady["wall_s"].sum()
    assert steady["preprocess"].sum() / total == pytest.approx(0.3, abs=0.01)
    assert steady["io"].sum() / total == pytest.approx(0.1, abs=0.01)
    assert steady["other"].sum() / total == pytest.approx(0.1, abs=0.01)
    assert steady["compute"].sum() / total == pytest.approx(0.5, abs=0.01)


def test_contention_with_workers_moves_rest_time_to_the_input_stages(tmp_path: Path) -> None:
    # 40 % wait, 60 % rest of which half was spent waiting for a core the workers held
    record_loop(tmp_path, 40, wait_s=0.04, compute_s=0.06)
    _, ledger = ledger_of(tmp_path, input_split={0: {"decode": 1.0}}, contention={0: 0.5})
    steady = ledger[ledger["analyzed"]]
    total = steady["wall_s"].sum()
    assert steady["decode"].sum() / total == pytest.approx(0.7, abs=0.01)
    assert steady["compute"].sum() / total == pytest.approx(0.3, abs=0.01)
    assert steady["contention_s"].sum() / total == pytest.approx(0.3, abs=0.01)
    assert steady["wait_s"].sum() / total == pytest.approx(0.4, abs=0.01)  # the wait as measured
    assert np.allclose(steady[list(CATEGORIES)].sum(axis=1), steady["wall_s"])


def test_contention_without_a_split_stays_whole_input(tmp_path: Path) -> None:
    record_loop(tmp_path, 40, wait_s=0.04, compute_s=0.06)
    _, ledger = ledger_of(tmp_path, contention={0: 0.5})
    steady = ledger[ledger["analyzed"]]
    assert steady["input"].sum() / steady["wall_s"].sum() == pytest.approx(0.7, abs=0.01)


def test_window_fractions_split_the_non_input_time(tmp_path: Path) -> None:
    record_loop(tmp_path, 30, wait_s=0.05, compute_s=0.05)
    _, ledger = ledger_of(tmp_path, {0: {"compute": 0.6, "other": 0.4}})
    steady = ledger[ledger["analyzed"]]
    total = steady["wall_s"].sum()
    assert steady["compute"].sum() / total == pytest.approx(0.3, abs=0.01)
    assert steady["other"].sum() / total == pytest.approx(0.2, abs=0.01)


def test_manual_steps_win_over_optimizer_steps(tmp_path: Path) -> None:
    record_loop(tmp_path, 20, optimizers=2, manual=True)
    ranks, ledger = ledger_of(tmp_path)
    assert ranks[0].kind == "manual"
    assert len(ledger) == 19


def test_two_optimizers_stepping_each_iteration_make_one_step(tmp_path: Path) -> None:
    record_loop(tmp_path, 20, optimizers=2)
    ranks, ledger = ledger_of(tmp_path)
    assert ranks[0].kind == "optimizer"
    assert len(ledger) == 19


def test_backward_marks_steps_when_weights_are_updated_by_hand(tmp_path: Path) -> None:
    record_loop(tmp_path, 20, use_optimizer=False)
    ranks, ledger = ledger_of(tmp_path)
    assert ranks[0].kind == "backward"
    assert len(ledger) == 19


def test_dataloader_cadence_when_nothing_else(tmp_path: Path) -> None:
    clock = FakeClock()
    from doctor.record.session import Session

    s = Session(tmp_path, clock=clock, window_start=10**9)
    for _ in range(12):
        t0 = clock()
        clock.tick(0.03)
        s.record_interval("loader_wait", t0, clock(), 0)
        clock.tick(0.01)
    s.close()
    ranks, ledger = ledger_of(tmp_path)
    assert ranks[0].kind == "dataloader"
    assert ledger["input"].sum() / ledger["wall_s"].sum() == pytest.approx(0.75, abs=0.01)


def test_slow_first_steps_are_warmup(tmp_path: Path) -> None:
    record_loop(tmp_path, 40, compute_s=0.01, slow_first=6)
    _, ledger = ledger_of(tmp_path)
    assert ledger["warmup"].sum() >= 5
    assert not ledger[ledger["analyzed"]]["wall_s"].gt(0.05).any()


def test_warmup_is_a_few_steps_when_all_are_alike() -> None:
    assert warmup_steps(np.full(100, 0.1)) == 3
    assert warmup_steps(np.full(2, 0.1)) == 1
    assert warmup_steps(np.zeros(0)) == 0


def test_the_step_that_closed_the_profiler_window_is_not_analysed(tmp_path: Path) -> None:
    clock = FakeClock()
    from doctor.record.session import Session

    s = Session(tmp_path, clock=clock, window_start=10**9)
    for i in range(30):
        if i == 12:
            s.record_event(EVENT_WINDOW_START)
        if i == 17:
            s.record_event(EVENT_WINDOW_STOP_BEGIN)
            clock.tick(0.5)  # the export
            s.record_event(EVENT_WINDOW_STOP_END)
        clock.tick(0.02)
        s.record_optimizer_start()
        s.record_optimizer_end(0)
    s.close()
    _, ledger = ledger_of(tmp_path)
    closing = ledger[ledger["window_close"]]
    assert len(closing) == 1
    assert closing["wall_s"].iloc[0] > 0.5
    assert not closing["analyzed"].iloc[0]
    inside = ledger[ledger["in_window"]]
    assert list(inside["step"]) == [12, 13, 14, 15, 16, 17]  # opening step to closing step
    assert not inside["analyzed"].any()


def test_ranks_are_kept_apart(tmp_path: Path) -> None:
    record_loop(tmp_path, 20, wait_s=0.01, rank=0)
    record_loop(tmp_path, 20, wait_s=0.05, rank=1)
    _, ledger = ledger_of(tmp_path)
    assert sorted(ledger["rank"].unique()) == [0, 1]
    per_rank = ledger.groupby("rank")["input"].median()
    assert per_rank[1] > 4 * per_rank[0]


def test_steps_during_stack_sampling_are_left_out_when_enough_remain(tmp_path: Path) -> None:
    # without the parent's schedstat samples (an older run directory) the sampler's pauses
    # cannot be measured: then only (tests/unit/test_thread_time.py: with them, they count)
    import json

    session = record_loop(tmp_path, 60, wait_s=0.05, compute_s=0.05)
    [main], _ = ledger_of(tmp_path)
    start = int(main.starts_ns[10])
    (session.directory / "stacks.json").write_text(json.dumps(
        {"recorder": "py-spy", "rate_hz": 50, "start_ns": start, "end_ns": start + int(2e9),
         "taken": 100}))
    _, ledger = ledger_of(tmp_path)
    assert ledger["sampled"].sum() == 20  # 2 s of 0.1 s steps
    assert not (ledger["sampled"] & ledger["analyzed"]).any()
    # a short run keeps them: fewer than 10 steps would be left
    (session.directory / "stacks.json").write_text(json.dumps(
        {"recorder": "py-spy", "rate_hz": 50, "start_ns": start, "end_ns": start + int(5e9),
         "taken": 250}))
    _, ledger = ledger_of(tmp_path)
    assert (ledger["sampled"] & ledger["analyzed"]).any()
