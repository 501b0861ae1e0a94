"""The step ledger: one row per (rank, step), seconds per category, adding up to the step's wall.

Step boundaries come from the strongest evidence the process left: ``doctor.step()`` calls,
else optimizer steps (of the optimizer that steps most), else ``backward()`` calls, else the
DataLoader's cadence (a step from one batch request to the next). Inside each step:

- input: the main process's DataLoader wait, split into io, decode and preprocess by where the
  loading work went (doctor.analyse.split); when that could not be measured (no stack samples),
  it stays whole in an extra ``input`` column;
- the rest of the step is split between transfer, compute, communication and other by the
  proportions measured in the torch.profiler window (see doctor.analyse.window); without a window,
  the rest is compute and a note says so;
- with DataLoader workers, the part of the rest that the training process spent waiting for a
  core the workers held (``contention``, measured from the kernel's run-queue delay) moves to the
  input stages: without the loading, the cores would have been the training's.

Warm-up steps (the first steps, lazy imports, compilation) and the steps of the profiler window
(which carry doctor's own profiling cost, its export most of all) are kept in the ledger but not
analysed; nor are the steps during stack sampling (py-spy pauses the processes 50 times a second
and takes CPU of its own) when at least MIN_UNSAMPLED_STEPS others remain. A step range
(``doctor report --steps A:B``) keeps the steps outside it in the ledger, unanalysed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from doctor.record.ringbuffer import RingFormatError, read_ring
from doctor.record.session import (
    EVENT_WINDOW_START,
    EVENT_WINDOW_STOP_BEGIN,
    EVENT_WINDOW_STOP_END,
    STEP_KIND_NAMES,
    STEP_MANUAL,
)
from doctor.store.rundir import ProcessRecord
from doctor.store.stacks import read_stacks_meta
from doctor.trace.intervals import overlap_per_span
from doctor.verdict import CATEGORIES, LEDGER_COLUMNS

NS = 1e-9
EVIDENCE_COLUMNS = ("input", "wait_s", "contention_s", "backward_s", "optimizer_s", "fetch_s")
MIN_UNSAMPLED_STEPS = 10
MIN_WARMUP_STEPS = 3
MAX_WARMUP_STEPS = 10


@dataclass
class RankSteps:
    """The raw material of one rank's ledger."""

    rank: int
    kind: str
    starts_ns: np.ndarray
    ends_ns: np.ndarray
    intervals: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    window_ns: tuple[int, int, int] | None = None  # start, stop begin, stop end
    sampled_ns: tuple[int, int] | None = None  # the stack sampler's span
    dropped: int = 0  # records overwritten in a full ring


def read_intervals(proc: ProcessRecord, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(t0_ns, t1_ns, key) of an interval ring, sorted by start; empty when absent."""
    path = proc.ring_path(name)
    empty = np.zeros(0, dtype=np.int64)
    if not path.is_file():
        return empty, empty, empty
    try:
        rec, _written = read_ring(path)
    except (RingFormatError, OSError):
        return empty, empty, empty
    order = np.argsort(rec["t0_ns"], kind="stable")
    return rec["t0_ns"][order], rec["t1_ns"][order], rec["key"][order]


def step_boundaries(proc: ProcessRecord) -> tuple[str, np.ndarray, np.ndarray]:
    """(kind, step starts, step ends) in ns from the strongest evidence available."""
    empty = np.zeros(0, dtype=np.int64)
    steps_path = proc.ring_path("steps")
    if steps_path.is_file():
        try:
            rec, _ = read_ring(steps_path)
            manual = np.sort(rec["t_ns"][rec["kind"] == STEP_MANUAL])
            if len(manual) >= 2:
                return STEP_KIND_NAMES[STEP_MANUAL], manual[:-1], manual[1:]
        except (RingFormatError, OSError):
            pass
    _t0, t1, key = read_intervals(proc, "optimizer")
    if len(t1) >= 2:
        keys, counts = np.unique(key, return_counts=True)
        top = keys[counts == counts.max()]
        # several optimizers stepping equally often (a GAN): the one that steps last closes it
        chosen = top[0] if len(top) == 1 else key[np.argmax(t1 * np.isin(key, top))]
        ends = np.sort(t1[key == chosen])
        return "optimizer", ends[:-1], ends[1:]
    _t0, t1, _ = read_intervals(proc, "backward")
    if len(t1) >= 2:
        ends = np.sort(t1)
        return "backward", ends[:-1], ends[1:]
    t0, _t1, _ = read_intervals(proc, "loader_wait")
    if len(t0) >= 2:
        starts = np.sort(t0)
        return "dataloader", starts[:-1], starts[1:]
    return "none", empty, empty


def window_span(proc: ProcessRecord) -> tuple[int, int, int] | None:
    path = proc.ring_path("events")
    if not path.is_file():
        return None
    try:
        rec, _ = read_ring(path)
    except (RingFormatError, OSError):
        return None
    found = {}
    for event in (EVENT_WINDOW_START, EVENT_WINDOW_STOP_BEGIN, EVENT_WINDOW_STOP_END):
        hits = rec["t_ns"][rec["event"] == event]
        if len(hits):
            found[event] = int(hits[0])
    if len(found) < 3:
        return None
    return found[EVENT_WINDOW_START], found[EVENT_WINDOW_STOP_BEGIN], found[EVENT_WINDOW_STOP_END]


def stacks_span(proc: ProcessRecord) -> tuple[int, int] | None:
    """When the stacks probe sampled this process (its stacks.json), or None."""
    meta = read_stacks_meta(proc.path)
    if meta is None:
        return None
    try:
        start, end = int(meta["start_ns"]), int(meta["end_ns"])
    except (ValueError, KeyError, TypeError):
        return None
    return (start, end) if end > start else None


def rank_steps(proc: ProcessRecord) -> RankSteps:
    kind, starts, ends = step_boundaries(proc)
    steps = RankSteps(proc.rank, kind, starts, ends, window_ns=window_span(proc),
                      sampled_ns=stacks_span(proc))
    for name in ("loader_wait", "backward", "optimizer", "fetch"):
        t0, t1, _ = read_intervals(proc, name)
        steps.intervals[name] = (t0, t1)
    return steps


def main_process(procs: list[ProcessRecord]) -> dict[int, ProcessRecord]:
    """Per rank, the process that trained: the one with the strongest, most numerous steps."""
    strength = {"manual": 4, "optimizer": 3, "backward": 2, "dataloader": 1, "none": 0}
    best: dict[int, tuple[tuple[int, int], ProcessRecord]] = {}
    for proc in procs:
        if proc.role.startswith("worker"):
            continue
        kind, _s, ends = step_boundaries(proc)
        score = (strength[kind], len(ends))
        if proc.rank not in best or score > best[proc.rank][0]:
            best[proc.rank] = (score, proc)
    return {rank: proc for rank, (score, proc) in best.items() if score[0] > 0}


def build_ledger(ranks: list[RankSteps], t0_ns: int | Mapping[int, int],
                 fractions: Mapping[int, Mapping[str, float]] | None = None,
                 input_split: Mapping[int, Mapping[str, float]] | None = None,
                 outside: Mapping[int, Mapping[str, float]] | None = None,
                 contention: Mapping[int, float] | None = None,
                 step_range: tuple[int, int] | None = None) -> pd.DataFrame:
    """The ledger over all ranks. ``t0_ns`` is the time origin (or one per rank);
    ``fractions[rank]`` splits non-input time by category, ``input_split[rank]`` the input
    wait into io, decode and preprocess, ``outside[rank]`` gives the fraction of each step
    spent building input outside a DataLoader, per stage, and ``contention[rank]`` the fraction
    of non-input time the training process waited for a core its DataLoader workers held.
    With ``step_range`` (first, last), 1-based and inclusive, only the steps in it are
    analysed."""
    origin = (lambda rank: t0_ns.get(rank, 0)) if isinstance(t0_ns, Mapping) else \
        (lambda rank: t0_ns)
    frames = [_rank_ledger(r, origin(r.rank), (fractions or {}).get(r.rank),
                           (input_split or {}).get(r.rank), (outside or {}).get(r.rank),
                           (contention or {}).get(r.rank, 0.0), step_range)
              for r in ranks]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return empty_ledger()
    return pd.concat(frames, ignore_index=True)


def empty_ledger() -> pd.DataFrame:
    cols: dict[str, pd.Series] = {}
    flags = ("warmup", "analyzed", "window_close", "in_window", "sampled", "in_range")
    for c in (*LEDGER_COLUMNS, *EVIDENCE_COLUMNS, "window_close", "in_window", "sampled",
              "in_range"):
        dtype = "bool" if c in flags else "int64" if c in ("rank", "step") else "float64"
        cols[c] = pd.Series(dtype=dtype)
    return pd.DataFrame(cols)


def _rank_ledger(r: RankSteps, t0_ns: int, fractions: Mapping[str, float] | None,
                 input_split: Mapping[str, float] | None,
                 outside: Mapping[str, float] | None, contention: float = 0.0,
                 step_range: tuple[int, int] | None = None) -> pd.DataFrame:
    n = len(r.ends_ns)
    if n == 0:
        return empty_ledger()
    s = r.starts_ns.astype(np.float64)
    e = r.ends_ns.astype(np.float64)
    wall = (e - s) * NS

    def overlap(name: str) -> np.ndarray:
        t0, t1 = r.intervals.get(name, (np.zeros(0), np.zeros(0)))
        return overlap_per_span(t0, t1, s, e) * NS

    wait = np.minimum(overlap("loader_wait"), wall)
    rest = wall - wait
    data: dict[str, np.ndarray] = {c: np.zeros(n) for c in CATEGORIES}
    unsplit = np.zeros(n)
    if input_split:
        for stage, frac in input_split.items():
            data[stage] = data[stage] + wait * frac
    else:
        unsplit = wait
    split = dict(fractions) if fractions else {"compute": 1.0}
    contended = rest * min(max(contention, 0.0), 1.0)
    for category, frac in split.items():
        data[category] = data[category] + (rest - contended) * frac
    if input_split:
        for stage, frac in input_split.items():
            data[stage] = data[stage] + contended * frac
    else:
        unsplit = unsplit + contended
    for stage, frac in (outside or {}).items():
        # Batches built in the loop are Python outside torch ops: the window counted them as
        # other (or, without a window, as compute); take them from there.
        want = wall * frac
        for source in ("other", "compute"):
            moved = np.minimum(data[source], want)
            data[source] = data[source] - moved
            data[stage] = data[stage] + moved
            want = want - moved
    out = pd.DataFrame({
        "rank": np.full(n, r.rank, dtype=np.int64),
        "step": np.arange(1, n + 1, dtype=np.int64),
        "start_s": (s - t0_ns) * NS,
        "wall_s": wall,
        **data,
        "input": unsplit,
        "wait_s": wait,
        "contention_s": contended,
        "backward_s": overlap("backward"),
        "optimizer_s": overlap("optimizer"),
        "fetch_s": overlap("fetch"),
    })
    first, last = step_range or (1, n)
    number = out["step"].to_numpy()
    in_range = (number >= first) & (number <= last)
    warm = warmup_steps(wall[:max(0, last)])  # what follows the range has no say in it
    out["warmup"] = np.arange(n) < warm
    closing = np.zeros(n, dtype=bool)
    inside = np.zeros(n, dtype=bool)
    if r.window_ns is not None:
        start, stop_begin, stop_end = r.window_ns
        closing = (e > stop_begin) & (s < stop_end)
        inside = (e > start) & (s < stop_end)
    sampled = np.zeros(n, dtype=bool)
    if r.sampled_ns is not None:
        sampled = (e > r.sampled_ns[0]) & (s < r.sampled_ns[1])
    out["window_close"] = closing
    out["in_window"] = inside
    out["sampled"] = sampled
    out["in_range"] = in_range
    analyzed = in_range & ~out["warmup"].to_numpy() & ~inside
    if (analyzed & ~sampled).sum() >= MIN_UNSAMPLED_STEPS:
        analyzed = analyzed & ~sampled
    out["analyzed"] = analyzed
    return out


def warmup_steps(wall: np.ndarray) -> int:
    """How many leading steps are warm-up: a few always, more while they stay slow."""
    n = len(wall)
    if n <= MIN_WARMUP_STEPS:
        return 0 if n < 2 else 1
    base = min(MIN_WARMUP_STEPS, n // 4)
    steady = float(np.median(wall[base:]))
    k = base
    while k < min(MAX_WARMUP_STEPS, n // 2) and wall[k] > 2.0 * steady:
        k += 1
    return k
