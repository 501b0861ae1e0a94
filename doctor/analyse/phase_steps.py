"""The phases (doctor.analyse.phases) against the steps: which steps they took over, what each
phase cost, and the phases as causes of slow steps.

- ``mark_phases``: the step table's ``phase`` column. A step that a phase took PHASE_PART of is
  that phase's (the one that took most), and is not analysed: the verdict, the shares and the
  training findings are over training steps only. A phase in more than MOST of a rank's steps
  (a save every step) is part of the steps, and marks none.
- ``phase_summaries``: per rank and phase, its count, time, time per occurrence, share of the
  run and of the steps' span, and what it was (batches a pass, bytes and write speed of the
  saves, the training loader's workers at epoch starts).
- ``phase_causes``: each phase as a Cause (doctor.analyse.causes) of slow steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from doctor.analyse.causes import Cause, Intervals
from doctor.analyse.phases import (
    CHECKPOINT,
    EVALUATION,
    LABELS,
    LOGGING,
    PHASES,
    TRAIN,
    PhasePieces,
    RankPhases,
    checkpoint_kind,
    log_library,
)
from doctor.trace.intervals import overlap_per_span, union
from doctor.units import human_bytes

PHASE_PART = 0.1  # a phase that took this share of a step's time makes it that phase's step
MOST = 0.5  # a phase in more than this share of a rank's steps is part of its steps
LISTED = 20  # step numbers kept per phase


def mark_phases(table: pd.DataFrame, phases: Mapping[int, RankPhases]) -> pd.DataFrame:
    """``table`` with its ``phase`` column, and its phase steps no longer analysed."""
    phase = np.full(len(table), TRAIN, dtype=object)
    ranks = table["rank"].to_numpy() if len(table) else np.zeros(0)
    for rank, found in phases.items():
        rows = np.flatnonzero(ranks == rank)
        if not len(rows) or not found.phases:
            continue
        s = table["start_s"].to_numpy(np.float64)[rows]
        wall = table["wall_s"].to_numpy(np.float64)[rows]
        best = np.zeros(len(rows))
        for kind in PHASES:
            pieces = found.phases.get(kind)
            if pieces is None:
                continue
            took = _overlap(pieces, s, s + wall)
            hit = (took >= PHASE_PART * wall) & (took > best)
            if hit.sum() > MOST * len(rows):
                continue
            phase[rows[hit]] = kind
            best = np.where(hit, took, best)
    training = phase == TRAIN
    return table.assign(phase=phase, analyzed=table["analyzed"].to_numpy(bool) & training)


def _span(rows: pd.DataFrame, found: RankPhases) -> float:
    """From the first step or phase to the last: the run's time where its duration is not
    known (a phase may come after the last step)."""
    starts = [float(p.start.min()) for p in found.phases.values() if len(p.start)]
    ends = [float(p.end.max()) for p in found.phases.values() if len(p.end)]
    if len(rows):
        starts.append(float(rows["start_s"].min()))
        ends.append(float((rows["start_s"] + rows["wall_s"]).max()))
    return max(ends) - min(starts) if starts else 0.0


def _overlap(p: PhasePieces, s: np.ndarray, e: np.ndarray) -> np.ndarray:
    us, ue = union(p.start, p.end)
    return overlap_per_span(us, ue, s, e) if len(us) else np.zeros(len(s))


@dataclass(frozen=True)
class PhaseSummary:
    """One rank's occurrences of one phase: count, time (s), time per occurrence, shares, the
    steps it took over, and what it was (None where it does not apply or is not known)."""

    rank: int
    kind: str
    count: int
    seconds: float
    longest_s: float
    share: float  # of the run's duration (of the rank's steps' time where that is unknown)
    in_steps_s: float  # its time within the rank's steps (first start to last end)
    steps_s: float  # that span
    steps: tuple[int, ...]  # the steps it took over (doctor.analyse.phase_steps.mark_phases)
    batches: float | None = None  # an evaluation pass's batches, on average
    bytes: float | None = None  # the bytes the saves wrote (those whose bytes are known)
    bytes_s: float | None = None  # their write speed (bytes over those saves' time)
    kinds: tuple[str, ...] = ()  # how the checkpoints were saved
    num_workers: int | None = None  # the training loader's workers (epoch starts)
    persistent_workers: bool | None = None
    libraries: str | None = None  # the libraries that logged ("logging, tensorboard")

    @property
    def label(self) -> str:
        return LABELS[self.kind]

    @property
    def per_s(self) -> float:
        return self.seconds / self.count if self.count else 0.0

    @property
    def share_of_steps(self) -> float:
        return self.in_steps_s / self.steps_s if self.steps_s > 0 else 0.0

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "rank": self.rank, "phase": self.kind, "label": self.label, "count": self.count,
            "seconds": round(self.seconds, 4), "per_occurrence_s": round(self.per_s, 4),
            "longest_s": round(self.longest_s, 4), "share_of_run": round(self.share, 4),
            "share_of_steps": round(self.share_of_steps, 4), "steps": list(self.steps)}
        extra = {"batches_per_pass": self.batches, "bytes": self.bytes,
                 "write_bytes_per_s": self.bytes_s, "num_workers": self.num_workers,
                 "persistent_workers": self.persistent_workers, "libraries": self.libraries}
        out.update({k: (round(v, 2) if isinstance(v, float) else v)
                    for k, v in extra.items() if v is not None})
        if self.kinds:
            out["saved_with"] = list(self.kinds)
        return out


def phase_summaries(table: pd.DataFrame, phases: Mapping[int, RankPhases],
                    loaders: pd.DataFrame, run_s: float | None) -> list[PhaseSummary]:
    """Each rank's phases (lowest rank first, in PHASES' order)."""
    out = []
    for rank in sorted(phases):
        found = phases[rank]
        rows = table[table["rank"] == rank]
        first = float(rows["start_s"].min()) if len(rows) else 0.0
        last = float((rows["start_s"] + rows["wall_s"]).max()) if len(rows) else 0.0
        whole = run_s if run_s and run_s > 0 else _span(rows, found)
        for kind in PHASES:
            p = found.phases.get(kind)
            if p is None or not (p.count or (kind == LOGGING and found.logging)):
                continue
            each = p.seconds(1.0) if p.count else np.zeros(1)
            inside = float(_overlap(p, np.array([first]), np.array([last]))[0]) \
                if last > first else 0.0
            marked = rows.loc[rows["phase"] == kind, "step"].tolist() if "phase" in rows else []
            base = PhaseSummary(
                rank=rank, kind=kind, count=p.count, seconds=float(each.sum()),
                longest_s=float(each.max()), share=float(each.sum()) / whole if whole > 0
                else 0.0, in_steps_s=inside, steps_s=max(last - first, 0.0),
                steps=tuple(int(s) for s in marked[:LISTED]))
            out.append(_logged(base, found, whole) if kind == LOGGING else
                       _what(base, p, each, found, loaders))
    return out


def _logged(base: PhaseSummary, found: RankPhases, whole: float) -> PhaseSummary:
    """The logging phase as the probe counted it: every call and its time, short ones too
    (the pieces hold only the calls of 1 ms or more); its time is the training thread's, so
    within the steps' span."""
    if found.logging is None:
        return base
    calls, seconds, libraries = found.logging
    share = seconds / whole if whole > 0 else 0.0
    return replace(base, count=int(calls), seconds=seconds, share=share,
                   in_steps_s=min(seconds, base.steps_s), libraries=libraries or None)


def _what(base: PhaseSummary, p: PhasePieces, each: np.ndarray, found: RankPhases,
          loaders: pd.DataFrame) -> PhaseSummary:
    """``base`` with what the phase was: batches a pass, bytes and write speed of the saves,
    the training loader's workers at epoch starts."""
    if p.kind == EVALUATION:
        known = p.detail["batches"][~np.isnan(p.detail["batches"])]  # none: found by the mode
        return replace(base, batches=float(known.mean()) if len(known) else None)
    if p.kind == CHECKPOINT:
        written = p.detail["bytes"]
        known = ~np.isnan(written)
        total = float(written[known].sum()) if known.any() else None
        took = float(each[known].sum())
        return replace(base, bytes=total,
                       bytes_s=total / took if total and took > 0 else None,
                       kinds=tuple(sorted({checkpoint_kind(k) for k in p.detail["how"]})))
    mine = loaders[(loaders["rank"] == base.rank) & (loaders["id"] == found.train_loader)] \
        if found.train_loader is not None and not loaders.empty and "id" in loaders \
        else loaders.iloc[0:0]
    if mine.empty:
        return base
    row = mine.iloc[0]
    return replace(base, num_workers=int(row["num_workers"]),
                   persistent_workers=bool(row["persistent_workers"]))


def phase_causes(phases: Mapping[int, RankPhases]) -> list[Cause]:
    """Each phase some rank had, as a cause of slow steps (its words: what each one was)."""
    out = []
    for kind in PHASES:
        intervals = {}
        for rank, found in phases.items():
            p = found.phases.get(kind)
            if p is None or not len(p.start):
                continue
            words = _words(p)
            intervals[rank] = Intervals.of(p.start, p.end,
                                           words=[words[int(o)] for o in p.occurrence])
        if intervals:
            out.append(Cause(kind, LABELS[kind], intervals))
    return out


def _words(p: PhasePieces) -> list[str]:
    each = p.seconds(1.0)
    if p.kind == EVALUATION:
        return [(f"evaluation pass of {int(b)} batches, {s:.2f} s" if b == b else
                 f"evaluation pass (model.eval() to model.train()), {s:.2f} s")
                for b, s in zip(p.detail["batches"], each, strict=True)]
    if p.kind == CHECKPOINT:
        return [f"{checkpoint_kind(k)}" + (f", {human_bytes(b)}" if b == b else "")
                + f", {s:.2f} s" for k, b, s in zip(p.detail["how"], p.detail["bytes"], each,
                                                     strict=True)]
    if p.kind == LOGGING:
        return [f"a {log_library(k)} call, {s:.2f} s"
                for k, s in zip(p.detail["library"], each, strict=True)]
    return [f"epoch start, {s:.2f} s" for s in each]


__all__ = ["MOST", "PHASE_PART", "PhaseSummary", "mark_phases", "phase_causes",
           "phase_summaries"]
