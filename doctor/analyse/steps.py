"""The step table: which process of each rank trained, where its steps begin and end, and which
steps the shares are taken over.

Step boundaries come from the strongest evidence a process left: ``doctor.step()`` calls, else
optimizer steps (of the optimizer that steps most), else ``backward()`` calls, else the
DataLoader's cadence (a step from one batch request to the next). A process with none of those
but a profiler window (a trace analysed on its own) has the window's own steps, each with its
own split of the time (``own_*`` columns); the window's steps carry profiling cost, but they are
then all there is.

Not analysed (kept in the table): warm-up steps (the first steps, lazy imports, compilation);
fragments (a step shorter than FRAGMENT of the median, a stray boundary); the steps of the
profiler windows, the first and the later ones (doctor's own profiling cost, its export most of
all); and the steps outside a
step range (``doctor report --steps A:B``). The steps during stack sampling (py-spy pauses the
process 50 times a second) are analysed, less the pauses measured in them
(doctor.analyse.thread_time: ``sampler_s``); only where the parent's schedstat samples of the
thread are missing (an older run directory, a kernel without schedstat) are they left out, as
long as MIN_UNSAMPLED_STEPS others remain.

Each step also carries what its training thread did (``running_s``, ``runnable_s``,
``blocked_s``; NaN where not measured), which the ledger uses so that a blocked step is never
counted as compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from doctor.analyse.scaler import scaler_updates
from doctor.analyse.thread_time import (
    SAMPLER_MEASURED,
    THREAD_COLUMNS,
    modelled_pause,
    sampler_pause,
    thread_times,
)
from doctor.errors import UsageError
from doctor.store.records import (
    EVENT_WINDOW_START,
    EVENT_WINDOW_STOP_BEGIN,
    EVENT_WINDOW_STOP_END,
    STEP_KIND_NAMES,
    STEP_MANUAL,
)
from doctor.store.rundata import Process, RunData
from doctor.trace.intervals import overlap_per_span
from doctor.trace.shares import EXCLUSIVE_COLUMNS

NS = 1e-9
MIN_UNSAMPLED_STEPS = 10
MIN_WARMUP_STEPS = 3
MAX_WARMUP_STEPS = 10
FRAGMENT = 0.05
WINDOW = "window"  # steps that are the profiler window's own
STRENGTH = {"manual": 4, "iteration": 3.5, "optimizer": 3, "graph": 2.5, "backward": 2,
            "dataloader": 1, WINDOW: 0.5, "none": 0}
#: Columns of a window-sourced step that carry its own split (seconds), then the device's
#: compute (GPU kernels; on a CPU trace, its compute).
OWN_COLUMNS = (*(f"own_{c}_s" for c in EXCLUSIVE_COLUMNS), "own_device_compute_s")
STEP_TABLE_COLUMNS = (
    "rank", "step", "start_s", "wall_s", "wait_s", "backward_s", "optimizer_s", "fetch_s",
    "warmup", "window_close", "in_window", "sampled", "in_range", "analyzed", "compiling",
    "skipped", "micro_batches", *OWN_COLUMNS, *THREAD_COLUMNS, SAMPLER_MEASURED,
)


@dataclass(frozen=True)
class RankSteps:
    """One rank's training process and its step boundaries (ns on its node's clock, or on the
    trace's clock for the window's own steps)."""

    rank: int
    node: int
    pid: int
    kind: str  # manual | graph | iteration | optimizer | backward | dataloader | window
    starts_ns: np.ndarray
    ends_ns: np.ndarray
    window_ns: tuple[int, int, int] | None = None  # start, stop begin, stop end
    sampled_ns: tuple[int, int] | None = None  # the stack sampler's span
    #: the pause per second on a core the sampler's plan expects (doctor.probes.stack_plan)
    sampler_model_s: float = 0.0
    later_ns: tuple[tuple[int, int, int], ...] = ()  # the later windows' spans, as window_ns

    @property
    def process(self) -> Process:
        return self.node, self.rank, self.pid


def training_processes(run: RunData) -> dict[int, RankSteps]:
    """Per rank, the process that trained: the first of its candidates (``rank_candidates``)."""
    return {rank: found[0] for rank, found in rank_candidates(run).items()}


def rank_candidates(run: RunData) -> dict[int, list[RankSteps]]:
    """Per rank, each process (DataLoader workers aside) that recorded steps, the one analysed
    first: the strongest kind of step boundary, then one that ended with the job over one still
    running when it ended (a daemon child that outlived it; not asked of a job killed by a
    signal, whose processes end without a word), then the most steps. Processes that
    recorded no step (a helper ``python -c``, a launcher) are no candidates, however large."""
    found: dict[int, list[tuple[tuple[float, bool, int], RankSteps]]] = {}
    procs = run.processes
    killed = run.record.signal is not None  # then no process of the job ended as it would
    for node, rank, role, pid, ended in zip(procs["node"], procs["rank"], procs["role"],
                                            procs["pid"], procs["ended_ns"], strict=True):
        if str(role).startswith("worker"):
            continue
        steps = _rank_steps(run, (int(node), int(rank), int(pid)))
        if STRENGTH[steps.kind] > 0:
            score = (STRENGTH[steps.kind], killed or bool(pd.notna(ended)), len(steps.ends_ns))
            found.setdefault(steps.rank, []).append((score, steps))
    return {rank: [steps for _score, steps in sorted(c, key=lambda x: x[0], reverse=True)]
            for rank, c in sorted(found.items())}


def choice_notes(run: RunData) -> list[str]:
    """A note for each rank where several processes recorded steps: which one is analysed, and
    which are left out (a forked or spawned child that trained too, a daemon that outlived the
    job)."""
    procs = run.processes
    ended = {(int(n), int(p)): bool(pd.notna(e)) or run.record.signal is not None
             for n, p, e in zip(procs["node"], procs["pid"], procs["ended_ns"], strict=True)}

    def said(steps: RankSteps) -> str:
        outlived = "" if ended.get((steps.node, steps.pid)) else \
            ", no exit recorded: it outlived the job, or was killed"
        return f"pid {steps.pid} ({len(steps.ends_ns)} {steps.kind} steps{outlived})"

    notes = []
    for rank, found in rank_candidates(run).items():
        if len(found) > 1:
            notes.append(f"Rank {rank}: {len(found)} processes recorded steps; the analysis is "
                         f"of {said(found[0])}; left out: "
                         f"{', '.join(said(s) for s in found[1:])}.")
    return notes


def _rank_steps(run: RunData, process: Process) -> RankSteps:
    kind, starts, ends = _boundaries(run, process)
    if kind == "none":
        own = run.rows("window", process)
        if not own.empty:
            starts = (own["start_us"].to_numpy(np.float64) * 1e3).astype(np.int64)
            ends = starts + (own["dur_s"].to_numpy(np.float64) * 1e9).astype(np.int64)
            kind = WINDOW
    node, rank, pid = process
    spans = window_spans(run, process)
    return RankSteps(rank, node, pid, kind, starts, ends, spans[0] if spans else None,
                     _sampled_span(run, process), modelled_pause(run, process),
                     tuple(spans[1:]))


def _boundaries(run: RunData, process: Process) -> tuple[str, np.ndarray, np.ndarray]:
    empty = np.zeros(0, dtype=np.int64)
    marks = run.rows("marks", process)
    manual = np.sort(marks.loc[marks["kind"] == STEP_MANUAL, "t_ns"].to_numpy(np.int64))
    if len(manual) >= 2:
        return STEP_KIND_NAMES[STEP_MANUAL], manual[:-1], manual[1:]
    graph = _graph_steps(run, process)
    if graph is not None:
        return "graph", graph[:-1], graph[1:]
    # a GradScaler's update() ends every iteration, also those whose optimizer step it skipped
    _t0, updates, _ = run.intervals_of(process, "scaler")
    if len(updates) >= 2 and len(updates) >= len(run.intervals_of(process, "optimizer")[1]):
        ends = np.sort(updates)
        return "iteration", ends[:-1], ends[1:]
    _t0, t1, key = run.intervals_of(process, "optimizer")
    if len(t1) >= 2:
        keys, counts = np.unique(key, return_counts=True)
        top = keys[counts == counts.max()]
        # several optimizers stepping equally often (a GAN): the one that steps last closes it
        chosen = top[0] if len(top) == 1 else key[np.argmax(t1 * np.isin(key, top))]
        ends = np.sort(t1[key == chosen])
        return "optimizer", ends[:-1], ends[1:]
    _t0, t1, _ = run.intervals_of(process, "backward")
    if len(t1) >= 2:
        ends = np.sort(t1)
        return "backward", ends[:-1], ends[1:]
    t0, _t1, _ = run.intervals_of(process, "loader_wait")
    if len(t0) >= 2:
        starts = np.sort(t0)
        return "dataloader", starts[:-1], starts[1:]
    return "none", empty, empty


def _graph_steps(run: RunData, process: Process) -> np.ndarray | None:
    """The ends of the CUDA graph replays that are the job's steps: a whole training step
    captured as one graph, replayed with no optimizer step or backward() in Python. They are,
    where more replays ran after the last optimizer step (or backward() call, where no optimizer
    stepped) than such steps ran in all: the ones before were the capture's warm-up. A graph of
    a part of the step (torch.compile's reduce-overhead) replays between optimizer steps."""
    _t0, replays, _ = run.intervals_of(process, "graph_replay")
    if len(replays) < 2:
        return None
    _t0, others, _ = run.intervals_of(process, "optimizer")
    if not len(others):
        _t0, others, _ = run.intervals_of(process, "backward")
    after = np.sort(replays[replays > others.max()]) if len(others) else np.sort(replays)
    return after if len(after) >= 2 and len(after) > len(others) else None


def boundaries_seen(run: RunData) -> int:
    """The most step boundaries any process of the job recorded (``doctor.step()`` calls,
    optimizer steps, ``backward()`` calls or DataLoader batches): the steps a job too short to
    time one ran (a step is the time from one boundary to the next)."""
    most = 0
    procs = run.processes
    for node, rank, pid in zip(procs["node"], procs["rank"], procs["pid"], strict=True):
        process = (int(node), int(rank), int(pid))
        marks = run.rows("marks", process)
        counts = [int((marks["kind"] == STEP_MANUAL).sum())]
        counts += [len(run.intervals_of(process, name)[1])
                   for name in ("optimizer", "backward", "loader_wait", "graph_replay")]
        most = max(most, *counts)
    return most


def window_spans(run: RunData, process: Process) -> list[tuple[int, int, int]]:
    """(start, stop begin, stop end) of each profiler window of a process, first first, from its
    events ring: the first window's, then each later one's (opened where the run slowed down).
    A window without its three events (one that failed) has none."""
    events = run.rows("events", process)
    codes, times = events["event"].to_numpy(), events["t_ns"].to_numpy()
    starts = np.sort(times[codes == EVENT_WINDOW_START])
    begins = np.sort(times[codes == EVENT_WINDOW_STOP_BEGIN])
    ends = np.sort(times[codes == EVENT_WINDOW_STOP_END])
    spans = []
    for i, start in enumerate(starts):
        before = starts[i + 1] if i + 1 < len(starts) else np.iinfo(np.int64).max
        begin = begins[(begins >= start) & (begins < before)]
        end = ends[(ends >= start) & (ends <= before)]
        if len(begin) and len(end):
            spans.append((int(start), int(begin[0]), int(end[0])))
    return spans


def _sampled_span(run: RunData, process: Process) -> tuple[int, int] | None:
    """When the stacks probe sampled this process, or None."""
    spans = run.rows("stack_spans", process)
    if spans.empty:
        return None
    start, end = int(spans["start_ns"].iloc[0]), int(spans["end_ns"].iloc[0])
    return (start, end) if end > start else None


def workers_by_parent(run: RunData) -> dict[Process, list[int]]:
    """The DataLoader worker processes of each process that started some: (node, rank, pid) of
    the parent -> the workers' pids."""
    p = run.processes
    workers = p[p["role"].astype(str).str.startswith("worker") & p["ppid"].notna()]
    out: dict[Process, list[int]] = {}
    for node, rank, ppid, pid in zip(workers["node"], workers["rank"], workers["ppid"],
                                     workers["pid"], strict=True):
        out.setdefault((int(node), int(rank), int(ppid)), []).append(int(pid))
    return out


def worker_pids(run: RunData, main: RankSteps) -> list[int]:
    """The DataLoader worker processes that the training process ``main`` started."""
    return workers_by_parent(run).get(main.process, [])


def step_range(steps: tuple[int | None, int | None] | None, ranks: dict[int, RankSteps]
               ) -> tuple[int, int] | None:
    """``steps`` with its open ends closed; UsageError when no rank has a step in it."""
    if steps is None or steps == (None, None):
        return None
    most = max((len(r.ends_ns) for r in ranks.values()), default=0)
    first, last = steps[0] or 1, steps[1] or most
    if first > most:
        raise UsageError(f"--steps from step {first}: the run has {most} steps per rank")
    if first < 1 or last < first:
        raise UsageError(f"--steps {first}:{last} is not a range of steps (first:last, from 1)")
    return first, last


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
    fragment = wall < FRAGMENT * float(np.median(wall[inside_range])) if inside_range.any() \
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
