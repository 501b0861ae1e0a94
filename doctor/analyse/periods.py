"""Periods of a run: the steps from each profiler window's start to the next one's.

A run whose step slowed down gets later windows (doctor.record.drift, in the job): each window's
evidence describes its own period. Here the ledger's steps of each later period are split by that
period's window (its fractions of the time outside the input wait, doctor.analyse.window) and by
the stacks sampled beside it (the input wait into io, decode and preprocess,
doctor.analyse.split), not the first window's; and each period gets its own summary (shares,
bottleneck: the one policy of doctor.analyse.bottleneck), for the verdict's ``periods``.

Ranks count their steps alike, but each process runs its own detector: the periods the verdict
names are the lowest rank's that had later windows, and each period's summary is over the steps
of every rank with those numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from doctor.analyse.bottleneck import summarise
from doctor.analyse.split import rank_split
from doctor.analyse.step_table import analysed
from doctor.analyse.steps import WINDOW, RankSteps
from doctor.analyse.window import WindowSplit, window_split
from doctor.errors import WindowUnavailable
from doctor.store.rundata import RunData


@dataclass(frozen=True)
class PeriodStart:
    """A later window's period: from ``step`` on (the first step of its window), of ``rank``."""

    rank: int
    window: int  # the window's number (2: the second of its process)
    step: int


def period_starts(run: RunData, ranks: Mapping[int, RankSteps]) -> dict[int, list[PeriodStart]]:
    """Per rank, where each later window's period begins, in order (none: one period). A later
    window whose trace was not read still begins a period (its steps keep the window before's
    split)."""
    out: dict[int, list[PeriodStart]] = {}
    for rank, r in ranks.items():
        if r.kind == WINDOW or not r.later_ns or not len(r.starts_ns):
            continue
        numbers = _window_numbers(run, r)
        starts = []
        for n, (start, _begin, _end) in zip(numbers, r.later_ns, strict=False):
            # the first step that ends after the window opened: the window's first
            first = int(np.searchsorted(r.ends_ns, start, side="right")) + 1
            if first <= len(r.ends_ns):
                starts.append(PeriodStart(rank, n, first))
        if starts:
            out[rank] = starts
    return out


def _window_numbers(run: RunData, r: RankSteps) -> list[int]:
    """The numbers of a process's later windows, in order: those its traces carry, else 2, 3..."""
    rows = run.rows("later_windows", r.process)
    found = sorted({int(n) for n in rows["window"]}) if not rows.empty else []
    return found if len(found) >= len(r.later_ns) else list(range(2, len(r.later_ns) + 2))


def later_splits(run: RunData, ranks: Mapping[int, RankSteps]
                 ) -> dict[int, dict[int, WindowSplit]]:
    """Per rank, each later window's split (by its number); a window that gives none (no time
    outside the input wait) is left out."""
    out: dict[int, dict[int, WindowSplit]] = {}
    for rank, r in ranks.items():
        rows = run.rows("later_windows", r.process)
        for n in sorted({int(v) for v in rows["window"]}):
            try:
                out.setdefault(rank, {})[n] = window_split(rows[rows["window"] == n])
            except WindowUnavailable:
                continue
    return out


def later_input_splits(run: RunData, ranks: Mapping[int, RankSteps],
                       workers: Mapping[int, list[int]]) -> dict[int, dict[int, InputFractions]]:
    """Per rank, the input split (io, decode, preprocess) of each later window, from the stacks
    sampled beside it (doctor.analyse.split, over a view of the run with those stacks); a
    window whose stacks hold no loading work is left out."""
    out: dict[int, dict[int, InputFractions]] = {}
    stacks, spans = run.later_stacks, run.later_stack_spans
    for n in sorted({int(v) for v in spans["window"]}):
        view = replace(run, stacks=stacks[stacks["window"] == n].drop(columns="window"),
                       stack_spans=spans[spans["window"] == n].drop(columns="window"))
        for rank, main in ranks.items():
            fractions = rank_split(view, main, workers.get(rank, [])).fractions
            if fractions is not None:
                out.setdefault(rank, {})[n] = fractions
    return out


InputFractions = Mapping[str, float]
Build = Callable[[pd.DataFrame, Mapping[int, WindowSplit], Mapping[int, InputFractions]],
                 pd.DataFrame]


def ledger_by_period(ledger: pd.DataFrame, table: pd.DataFrame,
                     starts: Mapping[int, list[PeriodStart]],
                     splits: Mapping[int, Mapping[int, WindowSplit]],
                     inputs: Mapping[int, Mapping[int, InputFractions]],
                     windows: Mapping[int, WindowSplit], build: Build) -> pd.DataFrame:
    """``ledger`` with each later period's steps built again by ``build`` (the ledger of a step
    table, given the windows' splits and input splits by rank) with that period's window's
    split (``splits``) and input split (``inputs``, from its stacks); what a later window did
    not give is the first's (``windows``); a period whose window gave neither keeps the
    ledger's rows."""
    replaced: list[pd.DataFrame] = []
    drop = np.zeros(len(ledger), dtype=bool)
    for rank, found in starts.items():
        ends = [s.step for s in found[1:]] + [np.iinfo(np.int64).max]
        for start, end in zip(found, ends, strict=True):
            split = splits.get(rank, {}).get(start.window)
            fractions = inputs.get(rank, {}).get(start.window)
            if split is None and fractions is None:
                continue
            rows = table[(table["rank"] == rank) & (table["step"] >= start.step)
                         & (table["step"] < end)]
            if rows.empty:
                continue
            split = split or windows.get(rank)
            replaced.append(build(rows, {rank: split} if split else {},
                                  {rank: fractions} if fractions else {}))
            drop |= ((ledger["rank"] == rank) & (ledger["step"] >= start.step)
                     & (ledger["step"] < end)).to_numpy()
    if not replaced:
        return ledger
    out = pd.concat([ledger[~drop], *replaced], ignore_index=True)
    return out.sort_values(["rank", "step"], kind="stable").reset_index(drop=True)


def first_period(ledger: pd.DataFrame, starts: Mapping[int, list[PeriodStart]]
                 ) -> pd.DataFrame:
    """The ledger's steps of each rank's first period (before its first later window)."""
    if not starts:
        return ledger
    keep = np.ones(len(ledger), dtype=bool)
    for rank, found in starts.items():
        keep &= ~((ledger["rank"] == rank) & (ledger["step"] >= found[0].step)).to_numpy()
    return ledger[keep]


def period_summaries(ledger: pd.DataFrame, starts: Mapping[int, list[PeriodStart]]
                     ) -> list[dict[str, Any]]:
    """The verdict's ``periods``: for each period (of the lowest rank with later windows), its
    steps, window, bottleneck, its share and the shares, over its analysed steps (their time in
    all: ``analysed_s``); empty where the run had one window."""
    if not starts or ledger.empty:
        return []
    found = starts[min(starts)]
    bounds = [(1, 1)] + [(s.step, s.window) for s in found]
    last = int(ledger["step"].max())
    out = []
    for i, (first, window) in enumerate(bounds):
        end = bounds[i + 1][0] - 1 if i + 1 < len(bounds) else last
        rows = ledger[(ledger["step"] >= first) & (ledger["step"] <= end)]
        if rows.empty:
            continue
        summary = summarise(rows)
        out.append({"first_step": first, "last_step": end, "window": window,
                    "analysed_s": round(float(analysed(rows)["wall_s"].sum()), 6),
                    "bottleneck": summary.bottleneck,
                    "bottleneck_share": round(summary.bottleneck_share, 4),
                    "shares": {k: round(v, 4) for k, v in summary.shares.items()},
                    "steps": summary.steps})
    return out
