"""Across ranks: the per-rank table of a distributed job."""

from __future__ import annotations

import pandas as pd

from doctor.verdict import CATEGORIES


def rank_table(ledger: pd.DataFrame) -> pd.DataFrame:
    """One row per rank: analysed steps, median step time and the shares of each category."""
    analysed = ledger[ledger["analyzed"]] if "analyzed" in ledger else ledger
    if analysed.empty or analysed["rank"].nunique() < 2:
        return pd.DataFrame()
    g = analysed.groupby("rank")
    wall = g["wall_s"].sum()
    table = pd.DataFrame({"steps": g.size(), "median_step_s": g["wall_s"].median()})
    for c in CATEGORIES:
        table[f"{c}_share"] = g[c].sum() / wall
    return table.reset_index()
