"""The records doctor writes and reads back besides verdict.json: a comparison (doctor compare),
a try's try.json and a process's meta.json. Each is a dataclass whose ``to_dict`` is the file's
(or the printed JSON's) shape and whose ``from_dict`` checks that shape first: a record that
lacks what its reader needs is one RecordSchemaError, not a KeyError deep in a report."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from doctor.analyse.analysis import Analysis, Tables
from doctor.analyse.compare import Comparison, compare
from doctor.categories import CATEGORIES
from doctor.errors import RecordSchemaError
from doctor.reports.tries import render_compare_json, render_compare_text
from doctor.store.tries import read_tries, write_try
from doctor.store.try_record import TRY_FORMAT, TryRecord
from doctor.verdict import LEDGER_COLUMNS, Verdict


def analysis(source: str, median_s: float, compute: float, workers: int,
             argv: list[str] | None = None) -> Analysis:
    shares = dict.fromkeys(CATEGORIES, 0.0)
    shares.update(compute=compute, decode=1.0 - compute)
    verdict = Verdict(bottleneck="decode" if compute < 0.5 else "compute", shares=shares,
                      steps={"count": 50, "analyzed": 40, "median_s": median_s}, findings=[],
                      probes={}, job={"device": "cpu", "ranks": 1, "cores": 8,
                                      "argv": argv or ["python", "train.py"]})
    loaders = pd.DataFrame({"num_workers": [workers], "pin_memory": [False],
                            "batch_size": [32]})
    return Analysis(verdict, pd.DataFrame(columns=list(LEDGER_COLUMNS)), source,
                    Tables(loaders=loaders))


def test_a_comparison_round_trips_through_its_json() -> None:
    got = compare(analysis("runs/a", 0.2, 0.3, 0), analysis("runs/b", 0.1, 0.6, 4))
    assert got.speedup == pytest.approx(2.0)
    assert got.shares["compute"].delta == pytest.approx(0.3)
    assert got.settings == {"num_workers": (0, 4)}  # from the loaders table, where it differs
    data = json.loads(render_compare_json(got))
    assert list(data) == ["a", "b", "speedup", "shares", "settings"]
    assert data["settings"] == {"num_workers": [0, 4]}
    again = Comparison.from_dict(data)
    assert json.loads(json.dumps(again.to_dict())) == data
    assert render_compare_text(again) == render_compare_text(got)


def test_runs_of_two_commands_say_so() -> None:
    got = compare(analysis("runs/a", 0.2, 0.3, 0), analysis("runs/b", 0.1, 0.3, 0,
                                                             ["python", "eval.py", "--fast"]))
    assert got.settings == {"command": ("python train.py", "python eval.py --fast")}
    assert "command: A python train.py, B python eval.py --fast" in render_compare_text(got)


def test_a_comparison_missing_what_its_reader_needs_is_one_schema_error() -> None:
    good = json.loads(render_compare_json(
        compare(analysis("a", 0.2, 0.3, 0), analysis("b", 0.1, 0.6, 4))))
    for broken in ({k: v for k, v in good.items() if k != "shares"},
                   {**good, "a": {"source": "a"}},
                   {**good, "shares": {"io": {"a": 0.1}}},
                   {**good, "settings": {"num_workers": [0]}},
                   ["not", "an", "object"]):
        with pytest.raises(RecordSchemaError):
            Comparison.from_dict(broken)  # type: ignore[arg-type]


def try_data() -> dict:
    """A try.json's dict as the runner writes it (doctor.tries.runner), every key."""
    return {
        "run": "doctor-runs/r", "dir": "doctor-runs/r/tries/1", "command": ["python", "t.py"],
        "cwd": "/w", "created": "2026-01-01T00:00:00+0000", "env_notes": [], "steps": 30,
        "steps_per_attempt": 15, "stop_at_step": 20, "repeat": 2, "sweep": None,
        "best": "input.loader:1", "unsteady": None,
        "baseline": {"median_step_s": 0.02, "steps": 30, "original_median_step_s": 0.02,
                     "rounds": []},
        "candidates": [{
            "id": "input.loader:1", "label": "num_workers=4",
            "apply": {"dataloader": {"num_workers": 4}}, "estimate": 2.9,
            "fixes": ["input.loader"], "title": "More workers", "outcome": "faster", "why": "",
            "speedup": 2.4, "low": 2.3, "high": 2.5, "per_round": [2.3, 2.5], "pooled": 2.4,
            "ratio": 0.83, "median_step_s": 0.009, "steps": 30, "applied": {}, "errors": [],
            "stderr_tail": "", "attempts": ["round-1/a"], "steal_share": [0.0]}],
        "manual": [{"id": "input.preprocess", "title": "Augment on the GPU"}],
        "cost": {"wall_s": 41.0, "attempts": 4},
    }


def test_a_try_record_round_trips_through_try_json(tmp_path: Path) -> None:
    folder = tmp_path / "tries" / "1"
    folder.mkdir(parents=True)
    record = TryRecord.from_dict(try_data())
    assert record.candidate("input.loader:1") is not None and record.candidates[0].speedup == 2.4
    path = write_try(folder, record)
    data = json.loads(path.read_text())
    assert list(data) == ["schema", *try_data()]  # the file's keys, in the runner's order
    assert {k: v for k, v in data.items() if k != "schema"} == try_data()
    [again] = read_tries(tmp_path)
    assert again.dir == "tries/1" and again.to_dict() == {**try_data(), "dir": "tries/1"}


def test_an_older_try_record_reads_with_defaults_and_a_broken_one_is_left_out(
        tmp_path: Path) -> None:
    old = {k: v for k, v in try_data().items() if k not in ("sweep", "cost")}
    old["candidates"] = [{k: v for k, v in old["candidates"][0].items() if k != "steal_share"}]
    record = TryRecord.from_dict(old)
    assert record.cost == {} and record.candidates[0].steal_share == []
    for broken in ({**try_data(), "candidates": [{"label": "no id"}]},
                   {**try_data(), "baseline": [1, 2]},
                   {**try_data(), "candidates": "input.loader:1"},
                   {**try_data(), "schema": "doctor.try/9"}):
        with pytest.raises(RecordSchemaError):
            TryRecord.from_dict(broken)
    folder = tmp_path / "tries" / "1"
    folder.mkdir(parents=True)
    (folder / "try.json").write_text(json.dumps(
        {"schema": TRY_FORMAT, **try_data(), "candidates": [{"label": "no id"}]}))
    assert read_tries(tmp_path) == []  # left out, as a record of another format is
