"""Split input-loading time into io, decode and preprocess, from stack samples.

Where loading runs (the main process for num_workers=0, the DataLoader workers otherwise), the
stacks probe samples the process's main thread at a fixed rate, running or blocked, so each
sample stands for the same slice of wall time; doctor.analyse.frames says which stage each
sample is in. The fractions of loading time per stage are sample counts over the loading
samples: no rate or span enters them. They then split the main process's wait of every step.

Input built outside a DataLoader is found in the main process's samples the same way
(doctor.analyse.frames.classify_outside_loader); its share of the main thread's samples moves
that much of each step from compute and other to the stage (doctor.analyse.ledger).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import pandas as pd

from doctor.analyse.frames import (
    MAIN_SCOPE,
    WORKER_SCOPE,
    FrameRule,
    classify,
    classify_outside_loader,
    classify_producer,
    waits_on_queue,
)
from doctor.analyse.steps import RankSteps, worker_pids
from doctor.categories import INPUT_STAGES
from doctor.store.process_rows import Process
from doctor.store.rundata import RunData
from doctor.store.stacks import PRODUCER_THREAD, StackSamples

OUTSIDE_MIN = 0.02  # below this share of the step, input outside a DataLoader is noise
TOP = 3  # functions named per stage in the evidence


@dataclass(frozen=True)
class InputSplit:
    """Where the loading time went, from stack samples (only when some were in the loading)."""

    stage_shares: Mapping[str, float]  # io, decode, preprocess: fractions of loading time
    top: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # stage -> top functions
    processes_sampled: int = 1
    recorders: tuple[str, ...] = ()
    collate_share_of_fetch: float | None = None  # collate_fn's part of the fetch time


@dataclass(frozen=True)
class OutsideLoader:
    """Batches built in the training loop itself (no DataLoader), from the main's samples."""

    stage_shares_of_step: Mapping[str, float]
    top: tuple[str, ...] = ()
    queue_share_of_step: float = 0.0  # of which, waits on a queue another thread feeds


@dataclass
class StageSplit:
    """Seconds of loading per stage over the sampled spans, and where they went."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(INPUT_STAGES, 0.0))
    top: defaultdict[tuple[str, str], float] = field(
        default_factory=lambda: defaultdict(float))  # (stage, function) -> seconds
    processes: int = 0
    recorders: set[str] = field(default_factory=set)
    fetch_s: float = 0.0  # over the whole run, in the loading processes
    collate_s: float = 0.0

    @property
    def fractions(self) -> dict[str, float] | None:
        total = sum(self.seconds.values())
        if total <= 0:
            return None
        return {s: v / total for s, v in self.seconds.items()}

    def add(self, samples: StackSamples, scope: re.Pattern[str],
            rules: Iterable[FrameRule] | None = None) -> None:
        """Add one process's samples: each one inside ``scope`` is 1/rate seconds of loading."""
        per_sample = 1.0 / max(samples.rate_hz, 1e-9)
        for stack, count in samples.stacks.items():
            hit = classify(stack, scope, rules)
            if hit is None or hit[0] == "doctor":
                continue
            stage, function = hit
            self.seconds[stage] += count * per_sample
            self.top[(stage, function)] += count * per_sample
        self.processes += 1
        self.recorders.add(samples.recorder)


@dataclass(frozen=True)
class OutsideShares:
    """One rank's batch building outside a DataLoader: fractions of the main thread's time."""

    shares: dict[str, float]  # per stage
    top: dict[tuple[str, str], float]  # (stage, function) -> fraction
    sampled_s: float  # the time the samples stand for
    queue_share: float = 0.0  # of which, waits on a queue another thread feeds


def stack_samples(run: RunData, process: Process) -> StackSamples | None:
    """One process's samples from the run's stack frames, or None."""
    spans = run.rows("stack_spans", process)
    rows = run.rows("stacks", process)
    if spans.empty or rows.empty:
        return None
    span = spans.iloc[0]
    producer = (rows["thread"] == PRODUCER_THREAD).to_numpy(bool)
    main, fed = rows[~producer], rows[producer]
    return StackSamples(dict(zip(main["stack"], (int(c) for c in main["count"]), strict=True)),
                        str(span["recorder"]), float(span["rate_hz"]),
                        (int(span["start_ns"]), int(span["end_ns"])), int(span["taken"]),
                        dict(zip(fed["stack"], (int(c) for c in fed["count"]), strict=True)))


def outside_loader_shares(samples: StackSamples, rules: Iterable[FrameRule] | None = None
                          ) -> OutsideShares:
    """Fractions of the main thread's time spent building input outside a DataLoader, per
    stage, and per (stage, function)."""
    taken = max(1, samples.count)
    shares = dict.fromkeys(INPUT_STAGES, 0.0)
    top: dict[tuple[str, str], float] = defaultdict(float)
    waited = 0.0
    for stack, count in samples.stacks.items():
        if waits_on_queue(stack):
            waited += count / taken
            continue
        hit = classify_outside_loader(stack, rules)
        if hit is not None:
            shares[hit[0]] += count / taken
            top[hit] += count / taken
    if waited > 0:  # the loop waited on a queue: for its producers' stages
        for (stage, function), part in producer_split(samples, rules).items():
            shares[stage] += waited * part
            top[(stage, function)] += waited * part
    return OutsideShares(shares, dict(top), samples.count / max(samples.rate_hz, 1e-9),
                         waited)


def producer_split(samples: StackSamples, rules: Iterable[FrameRule] | None = None
                   ) -> dict[tuple[str, str], float]:
    """(stage, function) -> fraction of the producer threads' samples (doctor.store.stacks),
    by the frame rules; all "preprocess" where none was sampled (a thread whose loop doctor
    cannot see: what it does is the job's own input code)."""
    total = sum(samples.producers.values())
    if total <= 0:
        return {("preprocess", "a queue fed by another thread"): 1.0}
    out: dict[tuple[str, str], float] = defaultdict(float)
    for stack, count in samples.producers.items():
        out[classify_producer(stack, rules)] += count / total
    return dict(out)


def loader_workers(run: RunData, main: RankSteps) -> int:
    """num_workers of the first DataLoader the training process iterated (0 without one)."""
    mine = run.rows("loaders", main.process)
    return int(mine["num_workers"].iloc[0]) if not mine.empty else 0


def rank_split(run: RunData, main: RankSteps, workers: list[int] | None = None,
               rules: Iterable[FrameRule] | None = None) -> StageSplit:
    """Where rank ``main``'s loading work went: in the main process or in its DataLoader
    workers (``workers``: their pids, found when not given)."""
    in_main = loader_workers(run, main) == 0
    if workers is None:
        workers = worker_pids(run, main)
    loading = [main.pid] if in_main else workers
    split = StageSplit()
    for pid in loading:
        split.fetch_s += _total_seconds(run, (main.node, main.rank, pid), "fetch")
        split.collate_s += _total_seconds(run, (main.node, main.rank, pid), "collate")
    scope = MAIN_SCOPE if in_main else WORKER_SCOPE
    for pid in loading:
        samples = stack_samples(run, (main.node, main.rank, pid))
        if samples is not None:
            split.add(samples, scope, rules)
    return split


def outside_loader(run: RunData, ranks: dict[int, RankSteps]) -> dict[int, OutsideShares]:
    """Per rank, the batch building outside a DataLoader that is more than noise."""
    out = {}
    for rank, main in ranks.items():
        samples = stack_samples(run, main.process)
        if samples is None:
            continue
        found = outside_loader_shares(samples)
        if sum(found.shares.values()) >= OUTSIDE_MIN:
            out[rank] = found
    return out


def _total_seconds(run: RunData, process: Process, name: str) -> float:
    t0, t1, _ = run.intervals_of(process, name)
    return float((t1 - t0).sum()) * 1e-9


def split_evidence(splits: dict[int, StageSplit]) -> InputSplit | None:
    """What the input split rests on, for the rules; None when no loading was sampled."""
    total = {s: sum(sp.seconds[s] for sp in splits.values()) for s in INPUT_STAGES}
    loading = sum(total.values())
    if loading <= 0:
        return None
    fetch = sum(sp.fetch_s for sp in splits.values())
    return InputSplit(
        stage_shares={s: v / loading for s, v in total.items()},
        top={stage: tuple(_ranked(((fn, v) for sp in splits.values()
                                   for (st, fn), v in sp.top.items() if st == stage)))
             for stage in INPUT_STAGES},
        processes_sampled=sum(sp.processes for sp in splits.values()),
        recorders=tuple(sorted({r for sp in splits.values() for r in sp.recorders})),
        collate_share_of_fetch=(sum(sp.collate_s for sp in splits.values()) / fetch
                                if fetch > 0 else None),
    )


def outside_evidence(outside: dict[int, OutsideShares]) -> OutsideLoader | None:
    if not outside:
        return None
    n = len(outside)
    return OutsideLoader(
        stage_shares_of_step={s: sum(o.shares.get(s, 0.0) for o in outside.values()) / n
                              for s in INPUT_STAGES},
        top=tuple(_ranked(((fn, v) for o in outside.values() for (_st, fn), v in o.top.items()))),
        queue_share_of_step=sum(o.queue_share for o in outside.values()) / n,
    )


def _ranked(items: Iterable[tuple[str, float]]) -> list[str]:
    return [fn for fn, _v in sorted(items, key=lambda kv: -kv[1])[:TOP]]


def top_functions(splits: dict[int, StageSplit], outside: dict[int, OutsideShares],
                  limit: int = 12) -> pd.DataFrame:
    """Where the loading time went, by function, loading inside and outside a DataLoader."""
    seconds: dict[tuple[str, str], float] = defaultdict(float)
    for sp in splits.values():
        for key, value in sp.top.items():
            seconds[key] += value
    for o in outside.values():
        for (stage, function), share in o.top.items():
            seconds[(stage, f"{function} [outside DataLoader]")] += share * o.sampled_s
    total = sum(seconds.values())
    if total <= 0:
        return pd.DataFrame()
    rows = sorted(seconds.items(), key=lambda kv: -kv[1])[:limit]
    return pd.DataFrame({"category": [k[0] for k, _ in rows],
                         "function": [k[1] for k, _ in rows],
                         "share_of_loading": [round(v / total, 3) for _, v in rows]})
