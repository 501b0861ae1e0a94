"""What the training thread did in the slow steps no cause explains, and how regularly they
came: what doctor can say of a spike it cannot name.

The parent's schedstat samples split each step into running (on a core), runnable (waiting for
one) and blocked (neither: a read, a lock, a sleep, a wait on another process;
doctor.analyse.thread_time). The spikes' time over the median step is split the same way: each
state's seconds in the spikes less the median step's, per spike. A state that took MOSTLY of it
names what the extra time was: blocked is waiting, never compute; running is work that some
steps do and others do not; runnable is a core taken by another thread or process. Only spikes
of OWN_TICKS of the parent's ticks or more count: a shorter step gets the mean of the ticks
around it, the steps beside it mixed in.

Spikes that come every N steps are periodic work in the loop: N is the period whose best
progression of steps (every N-th step from one of them) holds at least REGULAR of the spikes'
extra time, with a spike in at least REGULAR of its slots, and at least MIN_SPIKES of them (a
slow step just after each one, a cold cache, does not hide the period).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from doctor.store.samples import SAMPLE_INTERVAL_S

STATES = ("running_s", "runnable_s", "blocked_s")
BLOCKED, RUNNING, RUNNABLE = "blocked", "running", "runnable"
MOSTLY = 0.6  # a state that took this share of the spikes' extra time names it
REGULAR = 0.6  # spikes this often a fixed number of steps apart come every N steps
MIN_SPIKES = 3  # fewer spikes have no period to speak of
LAGS = 3  # periods tried: the steps between a spike and the next three...
PERIODS = 5  # ...the most common of them
OWN_TICKS = 2  # a spike this many of the parent's ticks long has its own thread times


@dataclass(frozen=True)
class SpikeContent:
    """The thread's state over the spikes' extra time (None: not measured), the state that took
    most of it where one took MOSTLY, and the steps between spikes where they were regular."""

    parts: dict[str, float] | None  # state -> its share of the extra time
    state: str | None  # BLOCKED, RUNNING, RUNNABLE, or None
    every: int | None  # spikes come every this many steps

    def to_evidence(self) -> dict[str, object]:
        out: dict[str, object] = {}
        if self.parts is not None:
            out["extra_time_thread"] = {k: round(v, 4) for k, v in self.parts.items()}
        if self.every is not None:
            out["every_steps"] = self.every
        return out


def spike_content(ledger: pd.DataFrame, spikes: np.ndarray) -> SpikeContent:
    """Of the ledger's rows ``spikes`` (a boolean mask), against the median step of all rows."""
    return SpikeContent(*_states(ledger, spikes), _period(ledger, spikes))


def _states(ledger: pd.DataFrame, spikes: np.ndarray) -> tuple[dict[str, float] | None,
                                                               str | None]:
    if not all(c in ledger for c in STATES):
        return None, None
    spikes = spikes & (ledger["wall_s"].to_numpy(np.float64) >= OWN_TICKS * SAMPLE_INTERVAL_S)
    if not spikes.any():
        return None, None
    values = ledger[list(STATES)].to_numpy(np.float64, copy=True)
    if "sampler_s" in ledger:  # stack sampling's pauses are blocked time, not the job's
        values[:, 2] -= np.nan_to_num(ledger["sampler_s"].to_numpy(np.float64))
    mine = values[spikes]
    if np.isnan(mine).any() or np.isnan(values).all():
        return None, None
    usual = np.nanmedian(values, axis=0)
    extra = np.clip(mine.sum(axis=0) - len(mine) * usual, 0.0, None)
    total = float(extra.sum())
    if total <= 0:
        return None, None
    parts = {name: float(x) / total for name, x in
             zip((RUNNING, RUNNABLE, BLOCKED), extra, strict=True)}
    top = max(parts, key=lambda k: parts[k])
    return parts, top if parts[top] >= MOSTLY else None


def _period(ledger: pd.DataFrame, spikes: np.ndarray) -> int | None:
    wall = ledger["wall_s"].to_numpy(np.float64)
    extra = wall - float(np.median(wall))
    best: tuple[float, int] | None = None
    for _, rows in ledger[spikes].assign(extra=extra[spikes]).groupby("rank"):
        steps = rows["step"].to_numpy(np.int64)
        weights = rows["extra"].to_numpy(np.float64)
        if len(steps) < MIN_SPIKES:
            continue
        ordered = np.sort(steps)
        gaps = np.concatenate([ordered[lag:] - ordered[:-lag] for lag in range(1, LAGS + 1)])
        values, counts = np.unique(gaps[gaps > 1], return_counts=True)
        for n in values[np.argsort(-counts, kind="stable")[:PERIODS]]:
            # the progression (a residue of n) that holds most of the spikes' extra time
            by_residue = np.bincount(steps % n, weights=weights)
            r = int(np.argmax(by_residue))
            on = steps % n == r
            slots = (steps[on].max() - steps[on].min()) // n + 1
            weight = float(by_residue[r])
            if on.sum() >= MIN_SPIKES and on.sum() >= REGULAR * slots and \
                    weight >= REGULAR * float(weights.sum()) and \
                    (best is None or weight > best[0] or (weight == best[0] and n < best[1])):
                best = (weight, int(n))
    return best[1] if best is not None else None
