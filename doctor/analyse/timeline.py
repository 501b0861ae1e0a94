"""The run on a time axis: what each process did when, for reports.timeline to write out.

Every process of the job is a process track (the training process of each rank, each of its
DataLoader workers), each with thread tracks: the steps (one slice per step, with its ledger
split), what the rings timed (DataLoader waits, backward, optimizer steps, the workers' fetches
and collates), the deep window and stack-sampling spans, and the profiler window's own events
(each thread and stream of the trace a track of its own, on the same clock). The parent's samples
are counter tracks: CPU, RSS and reads per process; the machine's busy and iowait cores; each
GPU's utilisation, memory and PCIe traffic.

Times are microseconds from the start of the node's run (each node's own clock: several nodes
are aligned at their run starts). Bounded whatever the run's length and its number of processes
(Caps): every step is kept (up to Caps.steps over the run, the newest of each rank beyond); each
process keeps its newest Caps.intervals intervals and profiler events (the trace's are capped as
they are read too, doctor.trace.window_events), fewer when the run has so many processes that
Caps.detail would be passed; each counter track at most Caps.counters samples, evenly thinned,
fewer under Caps.samples. ``notes`` say what was left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from doctor.analyse.frames import MAIN_SCOPE, WORKER_SCOPE
from doctor.analyse.split import StageSplit, loader_workers, stack_samples
from doctor.analyse.steps import RankSteps, training_processes
from doctor.categories import CATEGORIES, UNSPLIT_INPUT
from doctor.store.process_rows import Process, split_by
from doctor.store.rundata import RunData
from doctor.trace.window_events import STEP

INTERVAL_CAP = 10_000  # ring intervals (and profiler events) kept per process: the newest
COUNTER_CAP = 10_000  # samples kept per counter track (evenly thinned)
NODE_PIDS = 10_000_000  # track pid of process P on node K: P + K * NODE_PIDS
THREADS = 1024  # track tids of a process: its track pid * THREADS + k
MACHINE_PID, GPU_PID = 2**30, 2**30 + 1000  # the parent's samples' tracks (+ node, + gpu)
INTERVAL_NAMES = {"loader_wait": "DataLoader wait", "backward": "backward",
                  "optimizer": "optimizer step", "fetch": "fetch", "collate": "collate",
                  "gc": "garbage collection", "checkpoint": "checkpoint",
                  "loader_iter": "DataLoader iterator made", "loader_end": "DataLoader exhausted"}


@dataclass(frozen=True)
class Slices:
    """Slices of one kind on one thread track (microseconds; ``args`` per slice or None)."""

    category: str
    names: list[str]
    start_us: np.ndarray
    dur_us: np.ndarray
    args: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class Thread:
    tid: int
    name: str
    slices: list[Slices]


@dataclass(frozen=True)
class Counter:
    """One counter track: one or more series sampled at ``t_us``."""

    name: str
    t_us: np.ndarray
    series: dict[str, np.ndarray]


@dataclass(frozen=True)
class ProcessTrack:
    pid: int
    name: str
    sort: int
    threads: list[Thread] = field(default_factory=list)
    counters: list[Counter] = field(default_factory=list)


@dataclass(frozen=True)
class Caps:
    """How much of a run the timeline keeps: per process and track, and over the whole run."""

    intervals: int = INTERVAL_CAP  # per process: its rings' intervals; its window's events
    counters: int = COUNTER_CAP  # per counter track
    detail: int = 400_000  # intervals and window events over the whole run
    samples: int = 300_000  # counter samples over the whole run
    steps: int = 1_000_000  # step slices over the whole run

    def share(self, total: int, parts: int, most: int) -> int:
        """What each of ``parts`` may keep of ``total`` over the run, at most ``most``."""
        return max(1, min(most, total // max(1, parts)))


@dataclass(frozen=True)
class RunTimeline:
    processes: list[ProcessTrack]
    notes: list[str]


def run_timeline(run: RunData, ledger: pd.DataFrame, caps: Caps = Caps()) -> RunTimeline:
    """The timeline of ``run`` with the steps of its ledger (doctor.analyse.ledger)."""
    ranks = training_processes(run)
    trainers = {r.process: r for r in ranks.values()}
    notes: list[str] = []
    several_nodes = run.processes["node"].nunique() > 1
    tracks: list[ProcessTrack] = []
    procs = run.processes.sort_values(["node", "rank", "role", "pid"], kind="stable")
    cap = caps.share(caps.detail, 2 * len(procs), caps.intervals)
    tracked = len(procs) * 3 + len(run.system.groupby("node")) + 3 * len(run.gpu.groupby(
        ["node", "gpu"]))
    counter_cap = caps.share(caps.samples, tracked, caps.counters)
    steps_cap = caps.share(caps.steps, len(ranks), caps.steps)
    for node, rank, role, pid in zip(procs["node"], procs["rank"], procs["role"], procs["pid"],
                                     strict=True):
        process = (int(node), int(rank), int(pid))
        name = f"rank {rank} {role} (pid {pid})"
        if several_nodes:
            name = f"node {node} {name}"
        track = ProcessTrack(_pid(process), name, _sort(process, str(role)))
        origin = run.record.t0_ns.get(process[0], 0)
        steps = trainers.get(process)
        if steps is not None:
            track.threads.append(_steps_thread(track.pid, ledger, steps.rank, steps_cap, notes,
                                               name))
            track.threads.extend(_doctor_threads(track.pid, steps, origin))
        rings = _rings_thread(run, track.pid, process, str(role), origin, cap, notes, name)
        if rings.slices:
            track.threads.append(rings)
        track.threads.extend(_window_threads(run, track.pid, process, origin, cap, notes, name))
        track.counters.extend(_process_counters(run, process, counter_cap, notes, name))
        tracks.append(track)
    tracks.extend(_machine_tracks(run, counter_cap, notes))
    if several_nodes:
        notes.append("Each node's times are from its own run's start, on its own clock: the "
                     "nodes are aligned at their starts, not to the microsecond.")
    return RunTimeline(tracks, notes)


def _pid(process: Process) -> int:
    return process[2] + process[0] * NODE_PIDS


def _sort(process: Process, role: str) -> int:
    node, rank, _pid = process
    worker = int(role[len("worker"):] or 0) + 1 if role.startswith("worker") else 0
    return (node * 100_000 + rank) * 1_000 + worker


def _steps_thread(pid: int, ledger: pd.DataFrame, rank: int, cap: int, notes: list[str],
                  who: str) -> Thread:
    """One slice per step of the rank (its newest ``cap``), with its split (ms) and whether the
    shares count it."""
    rows = ledger[ledger["rank"] == rank] if not ledger.empty else ledger
    if len(rows) > cap:
        notes.append(f"{who}: the newest {cap:,} of its {len(rows):,} steps are kept (the run "
                     "has more steps than a timeline holds).")
        rows = rows.iloc[len(rows) - cap:]
    cats = [c for c in (*CATEGORIES, UNSPLIT_INPUT) if c in rows]
    # column by column, then one dict a step: a ledger of a million steps in seconds
    values = {c: rows[c].to_numpy(np.float64) for c in cats}
    positive = {c: np.isfinite(v) & (v > 0) for c, v in values.items()}
    cats = [c for c in cats if positive[c].any()]
    always = [c for c in cats if positive[c].all()]  # no test a step for these
    sometimes = [c for c in cats if c not in always]
    shown = {c: positive[c].tolist() for c in sometimes}
    ms = {c: np.round(values[c] * 1e3, 3).tolist() for c in cats}
    wall = np.round(rows["wall_s"].to_numpy(np.float64) * 1e3, 3).tolist()
    counted = _flag(rows, "analyzed").tolist()
    flags = [(_flag(rows, flag), word) for flag, word in (
        ("warmup", "warm-up"), ("in_window", "deep window"),
        ("window_close", "closes the deep window"), ("sampled", "stack sampling"))]
    marked = np.flatnonzero(np.any([f for f, _ in flags], axis=0)).tolist() if len(rows) else []
    args: list[dict[str, Any]] = [
        {"wall_ms": wall[i], "split_ms": {**{c: ms[c][i] for c in always},
                                          **{c: ms[c][i] for c in sometimes if shown[c][i]}},
         "analysed": counted[i]} for i in range(len(rows))]
    for i in marked:
        args[i]["marks"] = [word for f, word in flags if f[i]]
    start = rows["start_s"].to_numpy(np.float64) * 1e6
    dur = rows["wall_s"].to_numpy(np.float64) * 1e6
    names = [f"step {int(s)}" for s in rows["step"]]
    return Thread(pid * THREADS, "steps", [Slices("step", names, start, dur, args)])


def _flag(rows: pd.DataFrame, name: str) -> np.ndarray:
    """A boolean column of the ledger (False where absent or missing)."""
    if name not in rows:
        return np.zeros(len(rows), dtype=bool)
    return rows[name].fillna(False).to_numpy(bool)


def _doctor_threads(pid: int, steps: RankSteps, origin: int) -> list[Thread]:
    """The deep window (its closing part inside it) and the stack sampler's span, each on a
    track of its own: sampling starts with the window and goes on after it."""
    threads = []
    if steps.window_ns is not None:
        start, stop, end = (np.array([t], np.float64) for t in steps.window_ns)
        threads.append(Thread(pid * THREADS + 1, "deep window", [
            Slices("doctor", ["deep window (torch.profiler)"], (start - origin) / 1e3,
                   (end - start) / 1e3),
            Slices("doctor", ["closing the window (profiler stop and export)"],
                   (stop - origin) / 1e3, (end - stop) / 1e3)]))
    if steps.sampled_ns is not None:
        start, end = (np.array([t], np.float64) for t in steps.sampled_ns)
        threads.append(Thread(pid * THREADS + THREADS - 1, "stack sampling", [
            Slices("doctor", ["stack sampling"], (start - origin) / 1e3, (end - start) / 1e3)]))
    return threads


def _rings_thread(run: RunData, pid: int, process: Process, role: str, origin: int, cap: int,
                  notes: list[str], who: str) -> Thread:
    """What the process's rings timed, its newest ``cap`` intervals; a worker's fetches (and a
    main process's that loads for itself) named by the stage its stack samples were in most."""
    found = {name: run.intervals_of(process, name) for name in INTERVAL_NAMES}
    starts = np.concatenate([t0 for t0, _t1, _k in found.values()])
    total = len(starts)
    floor = np.partition(starts, total - cap)[total - cap] if total > cap else None
    if floor is not None:
        notes.append(f"{who}: the newest {cap:,} of its {total:,} DataLoader and step-hook "
                     "intervals are kept (every step is).")
    stage = _loading_stage(run, process, role)
    slices = []
    for ring, (t0, t1, _key) in found.items():
        keep = t0 >= floor if floor is not None else np.ones(len(t0), dtype=bool)
        if not keep.any():
            continue
        label = INTERVAL_NAMES[ring]
        args = None
        if ring == "fetch" and stage is not None:
            label = f"fetch: {stage[0]}"
            args = [{"stage": stage[0], "stage_shares": stage[1]}] * int(keep.sum())
        slices.append(Slices(ring, [label] * int(keep.sum()),
                             (t0[keep] - origin) / 1e3, (t1[keep] - t0[keep]) / 1e3, args))
    return Thread(pid * THREADS + 2,
                  "DataLoader worker" if role.startswith("worker") else "training thread",
                  slices)


def _loading_stage(run: RunData, process: Process, role: str
                   ) -> tuple[str, dict[str, float]] | None:
    """(the stage most of the process's loading samples were in, every stage's share), for a
    worker or a main process without workers; None without stack samples."""
    samples = stack_samples(run, process)
    if samples is None:
        return None
    worker = role.startswith("worker")
    if not worker:
        main = RankSteps(process[1], process[0], process[2], "none", np.zeros(0), np.zeros(0))
        if loader_workers(run, main) != 0:
            return None
    split = StageSplit()
    split.add(samples, WORKER_SCOPE if worker else MAIN_SCOPE)
    fractions = split.fractions
    if fractions is None:
        return None
    stage = max(fractions, key=lambda s: fractions[s])
    return stage, {s: round(v, 3) for s, v in fractions.items()}


def _window_threads(run: RunData, pid: int, process: Process, origin: int, cap: int,
                    notes: list[str], who: str) -> list[Thread]:
    """The profiler window's events (its newest ``cap``, and every ProfilerStep), a thread track
    per thread and stream of the trace."""
    events = run.rows("window_events", process)
    if events.empty:
        return []
    status = run.rows("window_status", process)
    total = max(int(status["events"].max()) if not status.empty else 0, len(events))
    detail = events["kind"] != STEP
    if detail.sum() > cap:
        newest = events.loc[detail, "t0_ns"].nlargest(cap).index
        events = events[~detail | events.index.isin(newest)]
    if total > len(events):
        notes.append(f"{who}: the newest {len(events):,} of the torch.profiler window's "
                     f"{total:,} events are kept.")
    threads = []
    for k, (track, rows) in enumerate(events.groupby("track", sort=True)):
        start = (rows["t0_ns"].to_numpy(np.float64) - origin) / 1e3
        dur = (rows["t1_ns"].to_numpy(np.float64) - rows["t0_ns"].to_numpy(np.float64)) / 1e3
        slices = [Slices(f"torch.profiler {kind}", part["name"].tolist(),
                         start[(rows["kind"] == kind).to_numpy()],
                         dur[(rows["kind"] == kind).to_numpy()])
                  for kind, part in rows.groupby("kind", sort=True)]
        threads.append(Thread(pid * THREADS + 3 + min(k, THREADS - 5),
                              f"torch.profiler: {track}", slices))
    return threads


def _process_counters(run: RunData, process: Process, cap: int, notes: list[str], who: str
                      ) -> list[Counter]:
    host = run.host
    rows = host[(host["node"] == process[0]) & (host["pid"] == process[2])]
    if rows.empty:
        return []
    rows = _thin(rows.sort_values("t_s"), cap, notes, f"{who}: CPU, RSS and reads")
    t = rows["t_s"].to_numpy(np.float64) * 1e6
    counters = [Counter("CPU %", t, {"cpu": rows["cpu_pct"].to_numpy(np.float64)}),
                Counter("RSS MB", t, {"rss": rows["rss_bytes"].to_numpy(np.float64) / 2**20})]
    reads = rows["read_bytes"].to_numpy(np.float64)
    if np.isfinite(reads).any() and len(t) > 1:
        rate = np.diff(reads) / np.maximum(np.diff(t) / 1e6, 1e-9) / 1e6
        counters.append(Counter("reads MB/s", t[1:], {"reads": np.maximum(rate, 0.0)}))
    return counters


def _machine_tracks(run: RunData, cap: int, notes: list[str]) -> list[ProcessTrack]:
    tracks = []
    for (node,), rows in sorted(split_by(run.system, "node").items()):
        rows = _thin(rows.sort_values("t_s"), cap, notes, f"node {node}'s machine samples")
        t = rows["t_s"].to_numpy(np.float64) * 1e6
        series = {c: rows[c].to_numpy(np.float64) for c in ("busy_cores", "iowait_cores",
                                                             "runnable")}
        tracks.append(ProcessTrack(MACHINE_PID + node, f"machine (node {node})",
                                   10**12 + node,
                                   counters=[Counter("cores", t, series)]))
    for (node, gpu), rows in sorted(split_by(run.gpu, "node", "gpu").items()):
        rows = _thin(rows.sort_values("t_s"), cap, notes, f"GPU {gpu}'s samples")
        t = rows["t_s"].to_numpy(np.float64) * 1e6
        counters = [
            Counter("utilization %", t, {"sm": rows["util_pct"].to_numpy(np.float64),
                                         "memory": rows["mem_util_pct"].to_numpy(np.float64)}),
            Counter("memory used GB", t, {"used": rows["mem_used_bytes"].to_numpy(np.float64)
                                          / 1e9}),
            Counter("PCIe MB/s", t, {"tx": rows["pcie_tx_kbps"].to_numpy(np.float64) / 1e3,
                                     "rx": rows["pcie_rx_kbps"].to_numpy(np.float64) / 1e3})]
        tracks.append(ProcessTrack(GPU_PID + node * 64 + gpu,
                                   f"GPU {gpu} (node {node})", 10**12 + 1000 + gpu,
                                   counters=counters))
    return tracks


def _thin(rows: pd.DataFrame, cap: int, notes: list[str], what: str) -> pd.DataFrame:
    if len(rows) <= cap:
        return rows
    notes.append(f"{what}: {cap:,} of {len(rows):,} samples are drawn (evenly spaced).")
    return rows.iloc[np.linspace(0, len(rows) - 1, cap).astype(np.int64)]
