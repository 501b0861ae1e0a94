"""reports.tables: the numbers a report table holds that read as words (a GPU's ranks, the steps
a tenth of the run covers) are worded by the report, with "-" where there are none; the analysis
keeps them as numbers."""

from __future__ import annotations

import pandas as pd

from doctor.reports.tables import shown_table


def test_a_gpus_ranks_are_listed_and_a_gpu_without_one_shows_a_dash() -> None:
    frame = pd.DataFrame({"gpu": [0, 1], "ranks": [(0, 1), ()], "util_pct": [50.0, 0.0]})
    shown = shown_table("gpus", frame)
    assert list(shown["ranks"]) == ["0, 1", "-"]
    assert list(shown.columns) == ["gpu", "ranks", "util_pct"]  # in their place
    assert list(frame["ranks"]) == [(0, 1), ()]  # the analysis' table is left as it was


def test_the_steps_a_tenth_covers_read_first_to_last() -> None:
    frame = pd.DataFrame({"gpu": [0, 0], "steps": [(3, 9), ()]})
    assert list(shown_table("gpu_over_run", frame)["steps"]) == ["3-9", "-"]


def test_other_tables_are_shown_as_they_are() -> None:
    frame = pd.DataFrame({"steps": [(3, 9)], "ranks": [(1,)]})
    assert shown_table("ranks", frame) is frame
    assert shown_table("gpus", pd.DataFrame({"gpu": [0]}))["gpu"].tolist() == [0]

