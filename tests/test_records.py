"""The records doctor writes and reads back besides verdict.json: a comparison (doctor compare),
a try's try.json and a process's meta.json. Each is a dataclass whose ``to_dict`` is the file's
(or the printed JSON's) shape and whose ``from_dict`` checks that shape first: a record that
lacks what its reader needs is one RecordSchemaError, not a KeyError deep in a report."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from doctor.analyse.analysis import Analysis, Tables
from doctor.analyse.compare import Comparison, compare
from doctor.categories import CATEGORIES
from doctor.errors import RecordSchemaError
from doctor.reports.tries import render_compare_json, render_compare_text
from doctor.verdict import LEDGER_COLUMNS, Verdict


def analysis(source: str, median_s: float, compute: float, workers: int) -> Analysis:
    shares = dict.fromkeys(CATEGORIES, 0.0)
    shares.update(compute=compute, decode=1.0 - compute)
    verdict = Verdict(bottleneck="decode" if compute < 0.5 else "compute", shares=shares,
                      steps={"count": 50, "analyzed": 40, "median_s": median_s}, findings=[],
                      probes={}, job={"device": "cpu", "ranks": 1, "cores": 8})
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
