"""The step chart's whole run: steps folded into one bucket per pixel column without losing a
spike, and the marks of the run's phases and spikes.

``envelope`` folds a rank's steps (a million or more) into at most ``width`` buckets of
consecutive steps, each with its shortest, median and longest step and the mean of each
category: a single 30 s stall among a million 50 ms steps stays the maximum of its bucket, where
averaging would flatten it. ``whole_envelope`` does the same from the run's step buckets
(doctor.analyse.whole_run) when the ledger holds only the newest steps of a long run.

``phase_marks`` and ``spike_marks`` say where to mark evaluation passes, checkpoints and epoch
starts (the ledger's ``phase``), and the slow steps (SPIKE times the rank's median or more, and
the long stalls among the steps the ledger lost), at most one mark per bucket of each kind.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from doctor.analyse.causes import SPIKE
from doctor.analyse.phases import CHECKPOINT, EVALUATION, LABELS, PHASES, TRAIN
from doctor.analyse.whole_run import WholeRun, lost_stalls

#: Buckets of a chart (about one per two pixel columns of the report's chart).
WIDTH = 300


@dataclass(frozen=True)
class Envelope:
    """One rank's steps in buckets: each bucket's first step number, and per bucket the
    shortest, median (the mean where the steps are not at hand) and longest step, and the mean
    of each category (seconds)."""

    step: np.ndarray
    low: np.ndarray
    mid: np.ndarray
    high: np.ndarray
    means: dict[str, np.ndarray]
    folded: bool  # some bucket holds more than one step


def envelope(steps: np.ndarray, wall: np.ndarray, columns: dict[str, np.ndarray] | None = None,
             width: int = WIDTH) -> Envelope:
    """``steps`` (step numbers, ascending) and their ``wall`` in at most ``width`` buckets."""
    steps = np.asarray(steps, dtype=np.float64)
    wall = np.asarray(wall, dtype=np.float64)
    columns = columns or {}
    n = len(steps)
    if n <= width:
        return Envelope(steps, wall, wall, wall,
                        {k: np.asarray(v, dtype=np.float64) for k, v in columns.items()}, False)
    bucket = np.arange(n) * width // n  # consecutive steps, equal counts
    starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
    counts = np.diff(np.r_[starts, n])
    order = np.lexsort((wall, bucket))  # by bucket, then by time within it
    ranked = wall[order]
    mid = (ranked[starts + (counts - 1) // 2] + ranked[starts + counts // 2]) / 2
    means = {k: np.add.reduceat(np.asarray(v, dtype=np.float64), starts) / counts
             for k, v in columns.items()}
    return Envelope(steps[starts], np.minimum.reduceat(wall, starts), mid,
                    np.maximum.reduceat(wall, starts), means, True)


def ledger_envelope(rows: pd.DataFrame, cats: list[str], width: int = WIDTH) -> Envelope:
    """One rank's ledger rows in buckets (``envelope``), with the mean of each of ``cats``."""
    cols = {c: rows[c].fillna(0.0).to_numpy(np.float64) for c in cats}
    return envelope(rows["step"].to_numpy(np.float64), rows["wall_s"].to_numpy(np.float64),
                    cols, width)


def thousands(x: float, _pos: object = None) -> str:
    """A step number on a long axis: 250k, 1.5M."""
    return f"{x / 1e6:g}M" if abs(x) >= 1e6 else f"{x / 1e3:g}k" if abs(x) >= 1e4 else f"{x:g}"


def whole_envelope(whole: WholeRun, rank: int, width: int = WIDTH) -> Envelope | None:
    """Rank ``rank``'s whole run from its step buckets: at most ``width`` chart buckets, each
    with the shortest and longest of its steps and their mean."""
    r = whole.ranks.get(rank)
    if r is None or not len(r.steps):
        return None
    first = r.first_step.astype(np.float64)
    n = len(first)
    group = np.arange(n) * min(width, n) // n
    starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    steps = np.add.reduceat(r.steps, starts)
    took = np.add.reduceat(r.end_s - r.start_s, starts)
    mean = took / np.maximum(steps, 1)
    return Envelope(first[starts], np.minimum.reduceat(r.min_s, starts), mean,
                    np.maximum.reduceat(r.max_s, starts), {}, True)


@dataclass(frozen=True)
class Marks:
    """Step numbers to mark, by what they are (phase labels, ``slow step``, ``long stall``)."""

    at: dict[str, np.ndarray]


def phase_marks(rows: pd.DataFrame, whole: WholeRun | None = None, rank: int = 0,
                offset: int = 0, width: int = WIDTH) -> Marks:
    """The steps of each phase in one rank's ledger rows, and where the ledger holds only the
    newest steps (``whole``), the evaluation passes and checkpoints before them (from the rings
    that hold the whole run); one mark per bucket."""
    found: dict[str, np.ndarray] = {}
    whole_span = whole is not None and whole.partial() and rank in whole.ranks
    if whole is not None and whole_span:
        total = whole.ranks[rank].total
        for kind, name in ((EVALUATION, "evaluation"), (CHECKPOINT, "checkpoint")):
            at = whole.timed_steps(rank, name)
            at = at[at <= offset]  # the ledger's own steps say their phase below
            if len(at):
                found[LABELS[kind]] = at
    if "phase" in rows and not rows.empty:
        phase = rows["phase"].fillna(TRAIN).to_numpy()
        step = rows["step"].to_numpy(np.float64) + offset
        for kind in PHASES:
            at = step[phase == kind]
            if len(at):
                found[LABELS[kind]] = np.concatenate([found.get(LABELS[kind], np.zeros(0)), at])
    span = np.array([1.0, float(total)]) if whole_span else (
        rows["step"].to_numpy(np.float64) + offset if len(rows) else np.zeros(1))
    return Marks({k: _one_per_bucket(np.sort(v), span, width) for k, v in found.items()})


def spike_marks(rows: pd.DataFrame, whole: WholeRun | None, rank: int, offset: int = 0,
                width: int = WIDTH) -> Marks:
    """The slow steps of one rank (SPIKE times its median after warm-up, or more, outside the
    phases, which phase_marks marks), and the long stalls among the steps its ledger lost that
    no checkpoint, evaluation or collection explains (from the step buckets)."""
    found: dict[str, np.ndarray] = {}
    if len(rows):
        steady = rows[~rows["warmup"].fillna(False).astype(bool)] if "warmup" in rows else rows
        if "phase" in steady:
            steady = steady[steady["phase"].fillna(TRAIN).to_numpy() == TRAIN]
        wall = steady["wall_s"].to_numpy(np.float64)
        if len(wall):
            median = float(np.median(wall))
            at = steady["step"].to_numpy(np.float64)[wall >= SPIKE * median] + offset
            if len(at):
                found["slow step"] = _one_per_bucket(at, rows["step"].to_numpy(np.float64)
                                                     + offset, width)
    if whole is not None:
        lost = [s.step for s in lost_stalls(whole, rows) if s.rank == rank and not s.during]
        if lost:
            found["long stall"] = np.asarray(sorted(lost), dtype=np.float64)
    return Marks(found)


def _one_per_bucket(at: np.ndarray, all_steps: np.ndarray, width: int) -> np.ndarray:
    """``at`` with at most one step per width-th of the span of ``all_steps``."""
    lo, hi = float(np.min(all_steps)), float(np.max(all_steps))
    if hi <= lo:
        return at[:1]
    cell = np.floor((at - lo) / (hi - lo) * width)
    _, first = np.unique(cell, return_index=True)
    return at[np.sort(first)]


__all__ = ["WIDTH", "Envelope", "Marks", "envelope", "ledger_envelope", "phase_marks",
           "spike_marks", "thousands", "whole_envelope"]
