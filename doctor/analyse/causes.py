"""The cause of each slow step: what overlapped it, or "unexplained".

A slow step is a step after warm-up more than SPIKE times its rank's median step (the median of
the analysed steps), wherever it fell (among the analysed steps, in stack sampling, or left
out), with doctor's own trace export taken off (doctor.analyse.stalls); a step of the profiler
window is one only when it is a long stall (the window makes its steps slower itself).

A cause is generic (Cause): a name, what to call it, and per rank a set of intervals on the
ledger's clock (seconds from the run's start), each with the part of its overlap with a step
that is lost time (a GC pause: all of it; other processes on the cores: the share of the cores
they took), and a few words each. Each slow step gets the causes whose lost time in it is at
least MIN_PART of its time over the median; it is explained when they add up to EXPLAINS of it
or more, and then belongs to the cause that took most. Otherwise it is UNEXPLAINED. The slow
steps are grouped by cause: each group's steps, their time over the median and its share of the
run (SlowSteps). Where each cause's intervals come from is its own module's
(doctor.analyse.gc_pauses, doctor.analyse.machine_load), listed in
doctor.analyse.cause_sources.CAUSE_SOURCES: a new cause (evaluation, checkpoints, epoch starts)
is a function ``(run, stages) -> Cause | None`` appended there, with a finding of its own in
doctor.rules.causes, or the generic one made from its ``fix``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np
import pandas as pd

from doctor.analyse.spike_calls import spike_calls
from doctor.analyse.stalls import (
    ANALYSED,
    IN_WINDOW,
    LEFT_OUT,
    MIN_STALL_S,
    SAMPLING,
    STALL_FACTOR,
    rank_walls,
)
from doctor.analyse.whole_run import LOST
from doctor.verdict import Finding, Fix

SPIKE = 3.0  # a step this many times its rank's median is slow (doctor.rules.other's spikes)
MIN_PART = 0.25  # a cause counts in a step where it took this much of its time over the median
EXPLAINS = 0.5  # the causes that count explain a step when they took this much of it
UNEXPLAINED = "unexplained"
DETAILS = 3  # the words of at most this many intervals are kept per step


@dataclass(frozen=True)
class Intervals:
    """One rank's intervals of a cause: start and end (seconds from the run's start), the part
    of each one's overlap with a step that is lost time (0-1), and a few words each."""

    start_s: np.ndarray
    end_s: np.ndarray
    weight: np.ndarray
    words: tuple[str, ...] = ()

    @classmethod
    def of(cls, start_s: Sequence[float] | np.ndarray, end_s: Sequence[float] | np.ndarray,
           weight: Sequence[float] | np.ndarray | None = None,
           words: Sequence[str] = ()) -> Intervals:
        """Intervals sorted by start (weight 1 where none is given)."""
        start = np.asarray(start_s, dtype=np.float64)
        end = np.asarray(end_s, dtype=np.float64)
        w = np.ones(len(start)) if weight is None else np.asarray(weight, dtype=np.float64)
        order = np.argsort(start, kind="stable")
        said = tuple(words[int(i)] for i in order) if len(words) == len(start) else ()
        return cls(start[order], end[order], w[order], said)

    def __len__(self) -> int:
        return len(self.start_s)

    @cached_property
    def _reach(self) -> np.ndarray:
        """The latest end of each interval and those before it (sorted by start: the first
        that can reach a time)."""
        return np.maximum.accumulate(self.end_s) if len(self.end_s) else self.end_s

    def lost(self, t0: float, t1: float) -> tuple[float, list[int]]:
        """(seconds lost in [t0, t1), the indices of the intervals that overlap it)."""
        if not len(self.start_s):
            return 0.0, []
        lo = int(np.searchsorted(self._reach, t0, side="right"))
        hi = int(np.searchsorted(self.start_s, t1, side="left"))
        if hi <= lo:
            return 0.0, []
        s, e = self.start_s[lo:hi], self.end_s[lo:hi]
        part = np.clip(np.minimum(e, t1) - np.maximum(s, t0), 0.0, None)
        hits = [lo + int(i) for i in np.flatnonzero(part > 0)]
        return float((part * self.weight[lo:hi]).sum()), hits


@dataclass(frozen=True)
class Cause:
    """A kind of event that makes steps slow: its name (verdict.json's), what to call it
    ("garbage collection"), its intervals per rank, the fix that fits it (None: not the job's
    to fix, or said by its rule), and whether it is the machine rather than the job."""

    name: str
    label: str
    intervals: Mapping[int, Intervals]
    fix: Fix | None = None
    machine: bool = False
    follows: str | None = None  # the cause it follows from (a wait for another rank: the
    # cause of that rank's slow steps, doctor.analyse.peer_waits)


@dataclass(frozen=True)
class SlowStep:
    """One slow step of one rank, and what made it slow."""

    rank: int
    step: int
    start_s: float
    seconds: float
    median_s: float
    where: str  # doctor.analyse.stalls: ANALYSED, SAMPLING, IN_WINDOW or LEFT_OUT; or
    # doctor.analyse.whole_run's LOST: a step the rings no longer hold (numbered over the run)
    stall: bool  # a long stall too (doctor.analyse.stalls)
    cause: str  # the cause that took most of it, or UNEXPLAINED
    lost: Mapping[str, float] = field(default_factory=dict)  # cause -> seconds it took here
    words: tuple[str, ...] = ()  # the words of the main cause's intervals in it

    @property
    def over_s(self) -> float:
        """Its time over the median step: what the cause cost."""
        return max(self.seconds - self.median_s, 0.0)

    def to_dict(self) -> dict[str, object]:
        return {"rank": self.rank, "step": self.step, "seconds": round(self.seconds, 4),
                "median_s": round(self.median_s, 4), "cause": self.cause,
                "lost_s": {k: round(v, 4) for k, v in self.lost.items()},
                "what": list(self.words), "where": self.where, "stall": self.stall}


@dataclass(frozen=True)
class CauseGroup:
    """The slow steps of one cause: how many, their time over the median and its share of the
    run and of the steps' time after warm-up, and the time the cause took in them."""

    cause: str
    label: str
    machine: bool
    steps: tuple[SlowStep, ...]
    over_s: float
    share: float  # of the run
    lost_s: float
    steps_share: float = 0.0  # of the steps' time after warm-up (what the spikes were of)

    @property
    def count(self) -> int:
        return len(self.steps)


@dataclass(frozen=True)
class SlowSteps:
    """Every slow step of the run with its cause, the groups by cause (the largest first), and
    the causes that were looked for (by name)."""

    steps: tuple[SlowStep, ...]
    groups: tuple[CauseGroup, ...]
    causes: Mapping[str, Cause]
    whole_s: float  # the time the shares are of (the run's, summed over ranks)
    steps_s: float = 0.0  # the steps' time after warm-up, summed over ranks
    #: (rank, step) -> its extra seconds per call site, for the slow steps the stack samples
    #: cover (doctor.analyse.spike_calls)
    sites: Mapping[tuple[int, int], Mapping[str, float]] = field(default_factory=dict)

    def cause_of(self, rank: int, step: int) -> str | None:
        """The cause of a slow step of the step table (UNEXPLAINED where none), None for a
        step that is not."""
        for s in self.steps:
            if s.rank == rank and s.step == step and s.where != LOST:
                return s.cause
        return None

    def cause_words(self, step: SlowStep) -> str:
        """A slow step's cause in words: its label and what its first interval was
        ("Python's garbage collector (generation 2 collection, 600 ms, ...)")."""
        cause = self.causes.get(step.cause)
        label = cause.label if cause else step.cause
        return label + (f" ({step.words[0]})" if step.words else "")

    def explained(self) -> set[tuple[int, int]]:
        """(rank, step) of each slow step of the step table that has a cause."""
        return {(s.rank, s.step) for s in self.steps if s.cause != UNEXPLAINED
                and s.where != LOST}

    def group(self, cause: str) -> CauseGroup | None:
        return next((g for g in self.groups if g.cause == cause), None)


def slow_steps(table: pd.DataFrame, causes: Sequence[Cause],
               exports: Mapping[int, np.ndarray] | None = None,
               run_s: float | None = None) -> SlowSteps:
    """The slow steps of the step table (doctor.analyse.step_table), each with its cause
    among ``causes``, grouped; ``exports``: each rank's seconds of doctor's trace export per
    step (doctor.analyse.stalls.export_seconds); ``run_s``: the run's duration (else each rank's
    steps' time is the whole)."""
    found: list[SlowStep] = []
    whole = steps_s = 0.0
    for rank, rows, wall in rank_walls(table, exports):
        warm = rows["warmup"].to_numpy(bool)
        steady = rows["analyzed"].to_numpy(bool)
        if not steady.any():
            steady = ~warm
        whole += run_s if run_s and run_s > 0 else float(rows["wall_s"].sum())
        steps_s += float(wall[~warm].sum())
        if not steady.any():
            continue
        median = float(np.median(wall[steady]))
        stall = (wall >= STALL_FACTOR * median) & (wall >= MIN_STALL_S)
        slow = (wall > SPIKE * median) & ~warm & (~rows["in_window"].to_numpy(bool) | stall)
        numbers, starts = rows["step"].to_numpy(), rows["start_s"].to_numpy(np.float64)
        flags = {c: rows[c].to_numpy(bool) for c in ("in_window", "analyzed", "sampled")}
        for i in np.flatnonzero(slow):
            found.append(attributed(rank, int(numbers[i]), float(starts[i]), float(wall[i]),
                                    median, _where(*(bool(f[i]) for f in flags.values())),
                                                    bool(stall[i]), causes))
    return SlowSteps(tuple(found), _groups(found, causes, whole, steps_s),
                     {c.name: c for c in causes}, whole, steps_s)


def attributed(rank: int, step: int, t0: float, seconds: float, median: float, where: str,
               stall: bool, causes: Sequence[Cause]) -> SlowStep:
    """A slow step with the cause among ``causes`` that took most of it, or UNEXPLAINED."""
    over = max(seconds - median, 1e-12)
    lost: dict[str, float] = {}
    words: dict[str, tuple[str, ...]] = {}
    for cause in causes:
        intervals = cause.intervals.get(rank)
        if intervals is None:
            continue
        took, hits = intervals.lost(t0, t0 + seconds)
        if took >= MIN_PART * over:
            lost[cause.name] = took
            words[cause.name] = tuple(intervals.words[i] for i in hits[:DETAILS]
                                      if i < len(intervals.words))
    main = max(lost, key=lambda k: lost[k]) if lost else None
    if main is None or sum(lost.values()) < EXPLAINS * over:
        return SlowStep(rank, step, t0, seconds, median, where, stall, UNEXPLAINED, lost)
    return SlowStep(rank, step, t0, seconds, median, where, stall, main, lost, words[main])


def _groups(steps: list[SlowStep], causes: Sequence[Cause], whole: float, steps_s: float
            ) -> tuple[CauseGroup, ...]:
    labels = {c.name: c for c in causes}
    out = []
    for name in {s.cause for s in steps}:
        mine = tuple(s for s in steps if s.cause == name)
        over = sum(s.over_s for s in mine)
        cause = labels.get(name)
        out.append(CauseGroup(
            name, cause.label if cause else "no known cause", bool(cause and cause.machine),
            mine, over, over / whole if whole > 0 else 0.0,
            sum(s.lost.get(name, 0.0) for s in mine), over / steps_s if steps_s > 0 else 0.0))
    return tuple(sorted(out, key=lambda g: (g.cause == UNEXPLAINED, -g.over_s)))


def with_lost(slow: SlowSteps, lost: Sequence[SlowStep], lost_s: float) -> SlowSteps:
    """``slow`` with the slow steps found among the steps the rings no longer hold
    (doctor.analyse.lost_slow_steps) and those steps' time (``lost_s``) added: the groups
    regrouped over the whole run."""
    if not lost:
        return slow
    steps = [*slow.steps, *lost]
    steps_s = slow.steps_s + lost_s
    return replace(slow, steps=tuple(steps), steps_s=steps_s,
                   groups=_groups(steps, list(slow.causes.values()), slow.whole_s, steps_s))


def regrouped(slow: SlowSteps, steps: Sequence[SlowStep]) -> SlowSteps:
    """``slow`` with its steps replaced by ``steps`` (causes given again), grouped again over
    ``slow``'s causes."""
    return replace(slow, steps=tuple(steps),
                   groups=_groups(list(steps), list(slow.causes.values()), slow.whole_s,
                                  slow.steps_s))


def with_causes(findings: list[Finding], slow: SlowSteps) -> list[Finding]:
    """The long-stall findings (doctor.analyse.stalls), each with its step's cause where one is
    known: said after its title, and in its evidence (``cause``, ``what``); where none is, the
    calls its stack samples were in (doctor.analyse.spike_calls), where it was sampled."""
    out = []
    for f in findings:
        step = next((s for s in slow.steps if s.rank == f.evidence.get("rank")
                     and s.step == f.evidence.get("step") and s.where != LOST), None)
        if step is None or step.cause == UNEXPLAINED:
            calls = spike_calls(slow.sites, [(step.rank, step.step)]) if step else None
            out.append(f if calls is None else replace(
                f, title=f"{f.title}; its stack samples: {calls.words()}",
                evidence={**f.evidence, **calls.to_evidence()}))
            continue
        out.append(replace(f, title=f"{f.title}; it overlapped {slow.cause_words(step)}",
                           evidence={**f.evidence, "cause": step.cause,
                                     "what": list(step.words)}))
    return out


def _where(in_window: bool, analyzed: bool, sampled: bool) -> str:
    """Which steps a step fell among (as doctor.analyse.stalls says it)."""
    if in_window:
        return IN_WINDOW
    if analyzed:
        return ANALYSED
    if sampled:
        return SAMPLING
    return LEFT_OUT


__all__ = ["EXPLAINS", "MIN_PART", "SPIKE", "UNEXPLAINED", "Cause", "CauseGroup",
           "Intervals", "SlowStep", "SlowSteps", "attributed", "regrouped", "slow_steps",
           "with_causes", "with_lost"]
