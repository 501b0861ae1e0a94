"""The report's tables as they are shown: where the analysis gives a table numbers that read as
words (the ranks on a GPU, the steps a tenth of the run covers), they become words here, with
"-" where there are none; format_value (reports.text) then formats every other cell by its
column's unit. The analysis keeps the numbers (doctor.analyse.gpus.gpu_tables)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd


def ranks_words(ranks: Sequence[Any]) -> str:
    """``(0, 1)`` -> ``"0, 1"``; ``"-"`` for none."""
    return ", ".join(str(r) for r in ranks) or "-"


def steps_words(span: Sequence[Any]) -> str:
    """``(first, last)`` -> ``"first-last"``; ``"-"`` for none."""
    return f"{span[0]}-{span[1]}" if len(span) else "-"


#: Per table, the columns that are words once shown, and how.
WORDED: dict[str, dict[str, Callable[[Sequence[Any]], str]]] = {
    "gpus": {"ranks": ranks_words},
    "gpu_over_run": {"steps": steps_words},
}


def shown_table(name: str, frame: pd.DataFrame) -> pd.DataFrame:
    """Table ``name`` with its worded columns (WORDED) as the report shows them."""
    columns = {c: words for c, words in WORDED.get(name, {}).items() if c in frame}
    if not columns:
        return frame
    return frame.assign(**{c: frame[c].map(words) for c, words in columns.items()})
