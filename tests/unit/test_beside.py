"""doctor.trace.beside: a part computed in a forked child gives what computing it here gives,
and a child that fails, dies or cannot be forked costs only time."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest

from doctor.trace.beside import Beside
from tests.support import DATA_TRACES, SHARED_TRACES
from tests.trace_files import trace_id

PARENT = os.getpid()


def _table() -> tuple[int, pd.DataFrame]:
    return os.getpid(), pd.DataFrame({"op": ["a", "b"], "calls": [3, 4]})


def test_the_part_is_computed_in_a_child_and_comes_back() -> None:
    beside = Beside(_table)
    assert beside.forked
    pid, table = beside.result()
    assert pid != PARENT
    pd.testing.assert_frame_equal(table, _table()[1])


def _fails_in_a_child() -> int:
    if os.getpid() != PARENT:
        raise RuntimeError("only in the child")
    return 7


def _dies_in_a_child() -> int:
    if os.getpid() != PARENT:
        os._exit(9)  # killed, as by the out-of-memory killer: no answer at all
    return 8


@pytest.mark.parametrize(("compute", "want"), [(_fails_in_a_child, 7), (_dies_in_a_child, 8)])
def test_a_child_that_fails_or_dies_has_the_part_computed_here(compute: object, want: int
                                                               ) -> None:
    beside = Beside(compute)  # type: ignore[arg-type]
    assert beside.forked
    assert beside.result() == want


def test_without_a_fork_it_is_computed_here() -> None:
    beside = Beside(os.getpid, fork=False)
    assert not beside.forked
    assert beside.result() == PARENT


@pytest.mark.parametrize("path", [DATA_TRACES / "ddp_gloo_rank0.json.gz",
                                  SHARED_TRACES / "ddp_v100_rank1_of_2.json.gz"], ids=trace_id)
def test_a_trace_analysed_with_its_tables_beside_gives_the_same_run(
        monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    from doctor.store import traces
    from doctor.trace import tables

    if not path.is_file():
        pytest.skip("the shared traces are not beside this checkout")
    monkeypatch.setattr(tables, "BESIDE_EVENTS", 10**12)
    here = traces.load_traces([path])
    forked: list[bool] = []
    real = tables.Beside

    def spy(*args: object, **kwargs: object) -> Beside[object]:
        made = real(*args, **kwargs)  # type: ignore[arg-type]
        forked.append(made.forked)
        return made

    monkeypatch.setattr(tables, "BESIDE_EVENTS", 0)
    monkeypatch.setattr(tables, "Beside", spy)
    monkeypatch.setattr(tables, "NESTING_IN_C", True)
    traces.load_traces([path])
    assert forked == [False]  # with the nesting in C, the tables take too little to fork for
    monkeypatch.setattr(tables, "NESTING_IN_C", False)
    beside = traces.load_traces([path])
    assert forked == [False, True]
    for name in ("ops", "collectives", "window", "window_status", "memory"):
        pd.testing.assert_frame_equal(getattr(beside, name), getattr(here, name), obj=name)
