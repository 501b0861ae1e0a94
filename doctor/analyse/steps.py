"""Which process of each rank trained, and where its steps begin and end.

Step boundaries come from the strongest evidence a process left: ``doctor.step()`` calls, else
optimizer steps (of the optimizer that steps most), else ``backward()`` calls, else the
DataLoader's cadence (a step from one batch request to the next). A process with none of those
but a profiler window (a trace analysed on its own) has the window's own steps, each with its
own split of the time (``own_*`` columns of the step table); the window's steps carry profiling
cost, but they are then all there is.

The table of those steps, and which of them the shares are taken over, is
doctor.analyse.step_table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from doctor.analyse.thread_time import modelled_pause
from doctor.errors import UsageError
from doctor.store.process_rows import Process
from doctor.store.records import (
    EVENT_WINDOW_START,
    EVENT_WINDOW_STOP_BEGIN,
    EVENT_WINDOW_STOP_END,
    STEP_KIND_NAMES,
    STEP_MANUAL,
)
from doctor.store.rundata import RunData

NS = 1e-9
WINDOW = "window"  # steps that are the profiler window's own
STRENGTH = {"manual": 4, "iteration": 3.5, "optimizer": 3, "graph": 2.5, "backward": 2,
            "dataloader": 1, WINDOW: 0.5, "none": 0}


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
