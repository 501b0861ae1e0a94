"""In which call a slow step's time went, where stacks were sampled.

The training thread's stack samples are on the time axis (doctor.store.stack_times: runs of
identical samples, as py-spy or the in-process sampler saw them, running or blocked alike). A
slow step that they cover for at least COVERED of its time has its own samples: each run's
time inside the step. Each sample is named by its call site: the innermost frame of the job's
own code (not a library, not the standard library, not doctor) and the call it made there: the
library function it entered (``queue.Queue.get``, ``requests.api.get``, and the innermost one
where it went deeper: ``> socket.socket.recv_into``), or, for a call into C that has no Python
frame of its own (``time.sleep``, a lock's ``acquire``), the call on its source line. E.g.
``train.py:88 in fetch_remote -> requests.api.get > socket.socket.recv_into``.

A slow step's time per call site, less what an ordinary step spends there (the mean over the
sampled steps that are neither slow nor warm-up, for the part of the step that was sampled), is
its extra time per call site; a group of slow steps adds its steps' up (SpikeCalls), each call
site with its share of that extra time. Nothing here says what kind of work a site is: a step
blocked in ``socket.recv_into`` is a wait on the network, never compute.
"""

from __future__ import annotations

import keyword
import linecache
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import PurePath
from typing import Any

import numpy as np
import pandas as pd

from doctor.analyse.frames import Frame, is_user_code
from doctor.analyse.steps import NS, WINDOW, RankSteps
from doctor.analyse.whole_run import LOST
from doctor.store.rundata import RunData

COVERED = 0.5  # a slow step sampled for this share of its time has samples of its own
MOST = 3  # call sites said per group
StepKey = tuple[int, int]  # (rank, step)


@dataclass(frozen=True)
class CallTime:
    """One call site and the slow steps' extra time in it (seconds, share of the extra)."""

    site: str
    seconds: float
    share: float


@dataclass(frozen=True)
class SpikeCalls:
    """Where the extra time of a group of slow steps went: how many of them were sampled, their
    extra time that the samples place, and the call sites (the largest first)."""

    steps: int
    extra_s: float
    calls: tuple[CallTime, ...]

    def words(self) -> str:
        """"81% of the extra time in train.py:88 in fetch_remote -> ...; 9% in ..." (the two
        largest call sites)."""
        said = [f"{c.share:.0%} in {c.site}" for c in self.calls[:2]]
        return said[0].replace(" in ", " of the extra time in ", 1) + \
            "".join(f"; {w}" for w in said[1:])

    def to_evidence(self) -> dict[str, object]:
        return {"sampled_slow_steps": self.steps, "sampled_extra_s": round(self.extra_s, 4),
                "extra_time_calls": [{"call": c.site, "seconds": round(c.seconds, 4),
                                      "share": round(c.share, 4)} for c in self.calls]}


def step_sites(run: RunData, ranks: Mapping[int, RankSteps], table: pd.DataFrame,
               slow: Iterable[tuple[int, int, float, float]]
               ) -> dict[StepKey, dict[str, float]]:
    """Per slow step ``(rank, step, start_s, seconds)`` that the samples cover, its extra
    seconds per call site (only sites with some)."""
    wanted: dict[int, list[tuple[int, float, float]]] = {}
    for rank, step, start, seconds in slow:
        wanted.setdefault(rank, []).append((step, start, seconds))
    out: dict[StepKey, dict[str, float]] = {}
    for rank, steps in wanted.items():
        r = ranks.get(rank)
        if r is None or r.kind == WINDOW:
            continue
        runs = run.rows("stack_times", r.process)
        if runs.empty:
            continue
        origin = run.record.t0_ns.get(r.node, 0)
        t0 = (runs["t0_ns"].to_numpy(np.float64) - origin) * NS
        t1 = (runs["t1_ns"].to_numpy(np.float64) - origin) * NS
        sites = np.array([call_site(s) for s in runs["stack"]], dtype=object)
        usual = _usual(table[table["rank"] == rank], {s for s, _, _ in steps}, t0, t1, sites)
        for step, start, seconds in steps:
            times = _in_span(t0, t1, sites, start, start + seconds)
            covered = sum(times.values())
            if seconds <= 0 or covered < COVERED * seconds:
                continue
            part = covered / seconds  # of an ordinary step's time per site, this much is here
            extra = {site: took - usual.get(site, 0.0) * part for site, took in times.items()}
            out[(rank, step)] = {s: x for s, x in extra.items() if x > 0}
    return out


def _usual(rows: pd.DataFrame, slow: set[int], t0: np.ndarray, t1: np.ndarray,
           sites: np.ndarray) -> dict[str, float]:
    """Seconds per call site of an ordinary step (the mean of those wholly inside the
    samples)."""
    start = rows["start_s"].to_numpy(np.float64)
    end = start + rows["wall_s"].to_numpy(np.float64)
    ordinary = ~rows["warmup"].to_numpy(bool) & ~rows["step"].isin(slow).to_numpy(bool) & \
        (start >= t0.min()) & (end <= t1.max())
    total: dict[str, float] = {}
    for a, b in zip(start[ordinary], end[ordinary], strict=True):
        for site, took in _in_span(t0, t1, sites, a, b).items():
            total[site] = total.get(site, 0.0) + took
    count = int(ordinary.sum())
    return {site: took / count for site, took in total.items()} if count else {}


def _in_span(t0: np.ndarray, t1: np.ndarray, sites: np.ndarray, a: float, b: float
             ) -> dict[str, float]:
    """Seconds of the samples in [a, b) per call site."""
    part = np.clip(np.minimum(t1, b) - np.maximum(t0, a), 0.0, None)
    hit = part > 0
    out: dict[str, float] = {}
    for site, took in zip(sites[hit], part[hit], strict=True):
        out[site] = out.get(site, 0.0) + float(took)
    return out


def spike_calls(sites: Mapping[StepKey, Mapping[str, float]], steps: Iterable[StepKey]
                ) -> SpikeCalls | None:
    """The call sites of the extra time of ``steps`` (those that were sampled), or None."""
    total: dict[str, float] = {}
    sampled = 0
    for key in steps:
        mine = sites.get(key)
        if mine is None:
            continue
        sampled += 1
        for site, seconds in mine.items():
            total[site] = total.get(site, 0.0) + seconds
    extra = sum(total.values())
    if not sampled or extra <= 0:
        return None
    ordered = sorted(total.items(), key=lambda kv: -kv[1])[:MOST]
    return SpikeCalls(sampled, extra, tuple(CallTime(s, x, x / extra) for s, x in ordered))


def calls_of(sites: Mapping[StepKey, Mapping[str, float]], steps: Iterable[Any]
             ) -> SpikeCalls | None:
    """spike_calls of slow steps (doctor.analyse.causes.SlowStep), those of the step table
    (one the rings no longer hold has a number of the whole run, and no samples)."""
    return spike_calls(sites, [(s.rank, s.step) for s in steps if s.where != LOST])


@lru_cache(maxsize=4096)
def call_site(stack: Sequence[str]) -> str:
    """``file.py:LINE in function -> the call it made`` for the innermost frame of the job's
    own code in ``stack`` (outermost first); the innermost frame's module and function where
    the job's own code is not in it."""
    frames = [Frame.parse(f) for f in stack]
    user = max((i for i, f in enumerate(frames) if is_user_code(f)), default=None)
    if user is None:
        return _callee(frames[-1]) if frames else "?"
    here = frames[user]
    where = f"{PurePath(here.file).name}:{here.line} in {here.function}"
    inner = frames[user + 1:]
    if inner:
        first, last = _callee(inner[0]), _callee(inner[-1])
        return f"{where} -> {first}" + (f" > {last}" if last != first else "")
    called = _source_call(here)
    return f"{where} -> {called}" if called else where


def _callee(frame: Frame) -> str:
    """``module.function`` of a library frame (``queue.Queue.get``)."""
    module = re.sub(r"(/__init__)?\.py$", "", frame.file).replace("/", ".")
    return f"{module}.{frame.function}" if module else frame.function


_CALL = re.compile(r"([A-Za-z_][\w.]*)\s*\(")


def _source_call(frame: Frame) -> str | None:
    """The first call on the frame's source line (``time.sleep``), or None."""
    source = linecache.getline(frame.path, frame.line) if frame.path else ""
    for name in _CALL.findall(source):
        if not keyword.iskeyword(name.split(".")[0]):
            return name
    return None


__all__ = ["COVERED", "CallTime", "SpikeCalls", "call_site", "calls_of", "spike_calls",
           "step_sites"]
