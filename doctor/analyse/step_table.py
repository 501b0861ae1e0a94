"""The step table: one row per (rank, step) with its time, its waits, what its training thread
did, and whether it is analysed (the steps the shares are taken over).

Not analysed (kept in the table): warm-up steps (the first steps, lazy imports, compilation);
fragments (a step shorter than FRAGMENT of the median, a stray boundary: only where boundaries
are guessed, from the DataLoader's cadence or a trace's own steps; an optimizer step, a
backward or ``doctor.step()`` marks a real iteration, and a quick one, its batch already
waiting, is one: two workers that finish together hand over a batch after a 33 ms wait and
the next at once, and leaving the quick ones out made the job look as slow as with none); the
steps of the
profiler windows, the first and the later ones (doctor's own profiling cost, its export most of
all); and the steps outside a
step range (``doctor report --steps A:B``). The steps during stack sampling (py-spy pauses the
process 50 times a second) are analysed, less the pauses measured in them
(doctor.analyse.thread_time: ``sampler_s``); only where the parent's schedstat samples of the
thread are missing (an older run directory, a kernel without schedstat) are they left out, as
long as MIN_UNSAMPLED_STEPS others remain.

Each step also carries what its training thread did (``running_s``, ``runnable_s``,
``blocked_s``; NaN where not measured), which the ledger uses so that a blocked step is never
counted as compute. Where the steps come from: doctor.analyse.steps.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from doctor.analyse.scaler import scaler_updates
from doctor.analyse.steps import NS, WINDOW, RankSteps
from doctor.analyse.thread_time import (
    SAMPLER_MEASURED,
    THREAD_COLUMNS,
    sampler_pause,
    thread_times,
)
from doctor.store.rundata import RunData
from doctor.trace.intervals import overlap_per_span
from doctor.trace.shares import EXCLUSIVE_COLUMNS

MIN_UNSAMPLED_STEPS = 10
MIN_WARMUP_STEPS = 3
MAX_WARMUP_STEPS = 10
FRAGMENT = 0.05
#: The step kinds whose boundaries are guessed, so that a stray one makes a fragment.
GUESSED_BOUNDARIES = frozenset({"dataloader", WINDOW, "none"})
#: Columns of a window-sourced step that carry its own split (seconds), then the device's
#: compute (GPU kernels; on a CPU trace, its compute).
OWN_COLUMNS = (*(f"own_{c}_s" for c in EXCLUSIVE_COLUMNS), "own_device_compute_s")
STEP_TABLE_COLUMNS = (
    "rank", "step", "start_s", "wall_s", "wait_s", "backward_s", "optimizer_s", "fetch_s",
    "warmup", "window_close", "in_window", "sampled", "in_range", "analyzed", "compiling",
    "skipped", "micro_batches", *OWN_COLUMNS, *THREAD_COLUMNS, SAMPLER_MEASURED,
)


def step_table(run: RunData, ranks: dict[int, RankSteps],
               in_range: tuple[int, int] | None = None) -> pd.DataFrame:
    """One row per (rank, step): its time, its waits, and whether it is analysed."""
    windowed = [r for r in ranks.values() if r.kind == WINDOW and len(r.starts_ns)]
    trace_origin = min((int(r.starts_ns.min()) for r in windowed), default=0)
    frames = []
    for r in ranks.values():
        origin = trace_origin if r.kind == WINDOW else run.record.t0_ns.get(r.node, 0)
        frame = _rank_table(run, r, origin, in_range)
        if not frame.empty:
            frames.append(frame)
    if not frames:
        return empty_step_table()
    return pd.concat(frames, ignore_index=True)


def empty_step_table() -> pd.DataFrame:
    flags = ("warmup", "window_close", "in_window", "sampled", "in_range", "analyzed",
             "compiling", "skipped", SAMPLER_MEASURED)
    return pd.DataFrame({c: pd.Series(dtype="bool" if c in flags else "int64"
                                      if c in ("rank", "step") else "float64")
                         for c in STEP_TABLE_COLUMNS})


def _rank_table(run: RunData, r: RankSteps, origin_ns: int,
                in_range: tuple[int, int] | None) -> pd.DataFrame:
    n = len(r.ends_ns)
    if n == 0:
        return empty_step_table()
    s = r.starts_ns.astype(np.float64)
    e = r.ends_ns.astype(np.float64)
    wall = (e - s) * NS

    def overlap(name: str) -> np.ndarray:
        t0, t1, _ = run.intervals_of(r.process, name)
        return overlap_per_span(t0, t1, s, e) * NS

    out: dict[str, np.ndarray] = {"rank": np.full(n, r.rank, dtype=np.int64),
                                  "step": np.arange(1, n + 1, dtype=np.int64),
                                  "start_s": (s - origin_ns) * NS, "wall_s": wall}
    if r.kind == WINDOW:  # the trace's own steps keep its numbers (ProfilerStep#N)
        own = run.rows("window", r.process)
        out["step"] = own["step"].to_numpy(np.int64)
        for category, source in EXCLUSIVE_COLUMNS.items():
            out[f"own_{category}_s"] = own[source].to_numpy(np.float64)
        out["own_device_compute_s"] = np.where(own["device"] == "cuda", own["kernel_s"],
                                               own[EXCLUSIVE_COLUMNS["compute"]])
        out["wait_s"] = out["own_input_s"]
        for col in ("backward_s", "optimizer_s", "fetch_s"):
            out[col] = np.zeros(n)
        out["micro_batches"] = np.full(n, np.nan)
        out["skipped"] = np.zeros(n, dtype=bool)
    else:
        out["wait_s"] = np.minimum(overlap("loader_wait"), wall)
        out["backward_s"] = overlap("backward")
        out["optimizer_s"] = overlap("optimizer")
        out["fetch_s"] = overlap("fetch")
        out["micro_batches"], out["skipped"] = _iteration_columns(run, r)
        for col in OWN_COLUMNS:
            out[col] = np.full(n, np.nan)
    first, last = in_range or (1, n)
    number = np.arange(1, n + 1)  # a range counts steps from the first, whatever their numbers
    inside_range = (number >= first) & (number <= last)
    guessed = r.kind in GUESSED_BOUNDARIES
    fragment = wall < FRAGMENT * float(np.median(wall[inside_range])) \
        if guessed and inside_range.any() \
        else np.zeros(n, dtype=bool)
    # warm-up counts whole steps, up to the range's end (what follows has no say in it)
    whole = np.flatnonzero(~fragment & (number <= last))
    warm = np.isin(np.arange(n), whole[:warmup_steps(wall[whole])])
    closing = np.zeros(n, dtype=bool)
    inside = np.zeros(n, dtype=bool)
    for start, stop_begin, stop_end in ((r.window_ns,) if r.window_ns else ()) + r.later_ns:
        closing |= (e > stop_begin) & (s < stop_end)
        inside |= (e > start) & (s < stop_end)
    sampled = np.zeros(n, dtype=bool)
    span_s = None
    if r.sampled_ns is not None:
        sampled = (e > r.sampled_ns[0]) & (s < r.sampled_ns[1])
        span_s = ((r.sampled_ns[0] - origin_ns) * NS, (r.sampled_ns[1] - origin_ns) * NS)
    analyzed = inside_range & ~warm & ~fragment & ~inside
    times = None if r.kind == WINDOW else \
        thread_times(run.host, r.node, r.pid, out["start_s"], out["start_s"] + wall)
    for col in THREAD_COLUMNS:
        out[col] = np.full(n, np.nan)
    out[SAMPLER_MEASURED] = np.zeros(n, dtype=bool)
    if times is not None:
        pause, measured_pause = sampler_pause(times, out["start_s"], out["start_s"] + wall,
                                              span_s, analyzed, r.sampler_model_s)
        out.update(running_s=times.running, runnable_s=times.runnable, blocked_s=times.blocked,
                   sampler_s=pause)
        out[SAMPLER_MEASURED] = sampled & measured_pause
    measured = times is not None and bool(times.known[sampled].all())
    if not measured and (analyzed & ~sampled).sum() >= MIN_UNSAMPLED_STEPS:
        analyzed = analyzed & ~sampled
    # a step in which torch.compile compiled is no steady step (doctor.analyse.compiles)
    compiling = overlap("compile") > 0 if r.kind != WINDOW else np.zeros(n, dtype=bool)
    if (analyzed & ~compiling).sum() >= MIN_UNSAMPLED_STEPS:
        analyzed = analyzed & ~compiling
    out.update(warmup=warm, window_close=closing, in_window=inside, sampled=sampled,
               in_range=inside_range, analyzed=analyzed, compiling=compiling)
    return pd.DataFrame({c: out[c] for c in STEP_TABLE_COLUMNS})


def _iteration_columns(run: RunData, r: RankSteps) -> tuple[np.ndarray, np.ndarray]:
    """Each step's micro-batches (the backward() calls that ended in it: gradient accumulation
    where more than one; nan where the process recorded none) and whether a GradScaler skipped
    its optimizer step (doctor.analyse.scaler)."""
    _b0, b1, _ = run.intervals_of(r.process, "backward")
    if len(b1):
        b1 = np.sort(b1)
        micro = (np.searchsorted(b1, r.ends_ns, "right")
                 - np.searchsorted(b1, r.starts_ns, "right")).astype(np.float64)
    else:
        micro = np.full(len(r.ends_ns), np.nan)
    updates = scaler_updates(run, r.process)
    skipped = np.isin(r.ends_ns, updates.ends_ns[updates.skipped]) if updates is not None \
        else np.zeros(len(r.ends_ns), dtype=bool)
    return micro, skipped


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


def analysed(table: pd.DataFrame) -> pd.DataFrame:
    """The analysed steps, or every step of the range when too few to leave warm-up out."""
    rows = table[table["analyzed"]]
    return rows if not rows.empty else table[table["in_range"]]
