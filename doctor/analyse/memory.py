"""Where each rank's memory goes, measured: the model's state, the activations, the allocator,
the capacity and the headroom at the peak, and memory that grows over the run.

- parameters, gradients and optimizer state: the bytes of the tensors the optimizers hold, by
  device and dtype (doctor.probes.model_state), when the window opened, else at exit; gradients
  absent at both moments (``zero_grad`` right after ``step``) are as large as the parameters at
  the peak, and said to be derived;
- activations: the median bytes saved for backward per step of the profiler window
  (doctor.probes.saved_tensors); without them, on a GPU, the allocator's peak minus what stays
  allocated between steps (a trace with memory events) or minus the model's state on the GPU;
- the allocator (GPU): peak allocated and reserved, split blocks it cannot reuse, retries, OOMs,
  from its snapshots over the run (doctor.probes.memory) or a trace's memory events;
- capacity: the GPU's memory (the allocator's device, else NVML), or the RAM the job may use
  (a container's limit if lower); the peak against it is the reserved bytes (or NVML's used,
  if more) on a GPU, and on a CPU the training process's RSS plus its DataLoader workers' own
  memory, summed over the ranks of its machine;
- growth: the allocated bytes between steps (GPU) or the training process's RSS (CPU) after
  warm-up and after the profiler window (every step, sampled or not), fitted against steps
  (doctor.analyse.memory_growth); DataLoader workers' own memory over their life, from what
  each recorded as it started, against their RSS (pages copied, not allocated).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from doctor.analyse.gpus import GpuCounters
from doctor.analyse.memory_growth import Growth, WorkerGrowth, linear_growth, worker_growth
from doctor.analyse.steps import RankSteps
from doctor.store.rundata import RunData

NS = 1e-9
KINDS = ("parameters", "gradients", "optimizer_state", "activations")
OVER_RUN_POINTS = 200  # per rank, for the report's chart


@dataclass(frozen=True)
class RankMemory:
    """One rank's memory (bytes; None: not measured)."""

    rank: int
    node: int
    device: str  # cuda | cpu
    parts: Mapping[str, float]  # KINDS -> bytes, each part measured or derived
    derived: tuple[str, ...] = ()  # parts not measured directly (see the module docstring)
    by_dtype: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # kind -> dtype
    optimizers: tuple[str, ...] = ()
    activations_source: str | None = None
    resident_bytes: float | None = None  # allocated between steps (a GPU job)
    allocator: Mapping[str, float] = field(default_factory=dict)
    peak_bytes: float | None = None
    peak_source: str = ""
    capacity_bytes: float | None = None
    capacity_source: str = ""
    machine_peak_bytes: float | None = None  # every rank of its machine, on a CPU job
    growth: Growth | None = None
    batch_size: int | None = None
    over_run: tuple[tuple[float, float, float], ...] = ()  # (t_s, used, reserved or NaN)

    @property
    def static_bytes(self) -> float:
        return sum(self.parts.get(k, 0.0) for k in ("parameters", "gradients", "optimizer_state"))

    @property
    def used_bytes(self) -> float | None:
        """What counts against the capacity at the peak: the machine's (every rank of it) on
        a CPU job, the rank's own on a GPU."""
        return self.machine_peak_bytes if self.machine_peak_bytes is not None else self.peak_bytes

    @property
    def headroom_bytes(self) -> float | None:
        used = self.used_bytes
        if self.capacity_bytes is None or used is None:
            return None
        return self.capacity_bytes - used

    @property
    def largest_part(self) -> str | None:
        return max(self.parts, key=lambda k: self.parts[k]) if self.parts else None



@dataclass(frozen=True)
class MemoryEvidence:
    ranks: Mapping[int, RankMemory]
    workers: tuple[WorkerGrowth, ...] = ()
    world_size: int = 1



def _sum(rows: pd.DataFrame, kind: str) -> float:
    return float(rows.loc[rows["kind"] == kind, "bytes"].sum())


ByDtype = dict[str, dict[str, float]]  # kind -> "device:dtype" -> bytes


def _model_state(state: pd.DataFrame
                 ) -> tuple[dict[str, float], list[str], ByDtype, tuple[str, ...]]:
    """(parts, derived, by_dtype, optimizer classes) from one process's model_state rows."""
    parts: dict[str, float] = {}
    derived: list[str] = []
    by_dtype: ByDtype = {}
    optimizers = tuple(dict.fromkeys(str(d) for d in
                                     state.loc[state["kind"] == "optimizer", "dtype"]))
    model = state[state["kind"].isin(("parameters", "gradients", "optimizer_state"))]
    if not model.empty:
        tag = "window_start" if (model["tag"] == "window_start").any() else "exit"
        at = model[model["tag"] == tag]
        parts["parameters"] = _sum(at, "parameters")
        # gradients and state: the most any snapshot held (they may not exist at both)
        most = model.groupby(["kind", "tag"])["bytes"].sum().groupby(level="kind").max()
        grads = float(most.get("gradients", 0.0))
        if grads > 0:
            parts["gradients"] = grads
        else:
            parts["gradients"] = parts["parameters"]
            derived.append("gradients")
        parts["optimizer_state"] = float(most.get("optimizer_state", 0.0))
        for kind, device, dtype, nbytes in zip(at["kind"], at["device"], at["dtype"], at["bytes"],
                                               strict=True):
            by_dtype.setdefault(str(kind), {})[f"{device}:{dtype}"] = float(nbytes)
    steps = state[(state["kind"] == "activations") & (state["tag"] == "window_step")]
    if not steps.empty:
        parts["activations"] = float(steps["bytes"].median())
        mean = state[(state["kind"] == "activations") & (state["tag"] == "window")]
        by_dtype["activations"] = {f"{d}:{t}": float(b) for d, t, b in
                                   zip(mean["device"], mean["dtype"], mean["bytes"], strict=True)}
    return parts, derived, by_dtype, optimizers


def _allocator(mem: pd.DataFrame) -> dict[str, float]:
    def top(*cols: str) -> float:
        vals = [float(mem[c].max()) for c in cols if c in mem and mem[c].notna().any()]
        return max(vals) if vals else float("nan")

    out = {"allocated_peak_bytes": top("allocated_bytes", "peak_allocated_bytes"),
           "reserved_peak_bytes": top("reserved_bytes", "peak_reserved_bytes"),
           "inactive_split_max_bytes": top("inactive_split_bytes"),
           "alloc_retries": top("alloc_retries"), "num_ooms": top("num_ooms"),
           "device_total_bytes": top("total_bytes")}
    return {k: v for k, v in out.items() if np.isfinite(v)}


def _step_of(table: pd.DataFrame, t_s: np.ndarray) -> np.ndarray:
    """The step under way at each of ``t_s`` (seconds from the run's start), NaN outside."""
    starts = table["start_s"].to_numpy(float)
    order = np.argsort(starts)
    starts, numbers = starts[order], table["step"].to_numpy(float)[order]
    idx = np.searchsorted(starts, t_s, side="right") - 1
    out = np.where(idx >= 0, numbers[np.clip(idx, 0, None)], np.nan) if len(starts) else \
        np.full(len(t_s), np.nan)
    return out.astype(float)


def _growth_stretch(t_s: np.ndarray, table: pd.DataFrame, main: RankSteps, t0_ns: int
                    ) -> np.ndarray:
    """Which samples the growth fit uses: from the first step after warm-up to the last step's
    end, after the profiler window when as much of the run follows it as precedes it, else
    before it (the window's own buffers come and go at once)."""
    steady = table[~table["warmup"]] if "warmup" in table else table
    if steady.empty:
        return np.zeros(len(t_s), bool)
    lo, hi = float(steady["start_s"].min()), float((steady["start_s"] + steady["wall_s"]).max())
    inside = (t_s >= lo) & (t_s <= hi)
    if main.window_ns is None:
        return inside
    w0, w1 = (main.window_ns[0] - t0_ns) * NS, (main.window_ns[2] - t0_ns) * NS
    after, before = inside & (t_s > w1), inside & (t_s < w0)
    return after if after.sum() >= before.sum() else before


def _thin(rows: list[tuple[float, float, float]]) -> tuple[tuple[float, float, float], ...]:
    step = max(1, len(rows) // OVER_RUN_POINTS)
    return tuple(rows[::step])


def _batch_size(loaders: pd.DataFrame, rank: int) -> int | None:
    mine = loaders[loaders["rank"] == rank] if "rank" in loaders else loaders
    for value in mine.get("batch_size", ()):
        try:
            return int(value)
        except (TypeError, ValueError):
            continue
    return None


@dataclass
class _Side:
    """What one side (the allocator on a GPU, RSS on a CPU) adds to a rank's memory."""

    allocator: dict[str, float] = field(default_factory=dict)
    resident: float | None = None
    activations_source: str | None = None
    over: list[tuple[float, float, float]] = field(default_factory=list)
    growth: Growth | None = None


def _gpu_side(mem: pd.DataFrame, parts: dict[str, float], derived: list[str],
              by_dtype: ByDtype, steps_of: pd.DataFrame, main: RankSteps, t0: int) -> _Side:
    """The allocator's snapshots (or a trace's steps); activations from its peak where they
    were not counted (``parts`` and ``derived`` are completed in place)."""
    side = _Side(allocator=_allocator(mem))
    steps = mem[mem["tag"].isin(("step", "trace_step"))]
    if (steps["tag"] == "trace_step").any():
        side.resident = float(steps["allocated_bytes"].median())
    static_gpu = sum(b for k, v in by_dtype.items() if k != "activations"
                     for d, b in v.items() if d.startswith("cuda"))
    base = side.resident if side.resident is not None else static_gpu or None
    if base and "allocated_peak_bytes" in side.allocator:
        above = max(side.allocator["allocated_peak_bytes"] - base, 0.0)
        side.allocator["peak_above_static_bytes"] = above  # a cross-check of the saved bytes
        if "activations" not in parts:
            parts["activations"] = above
            derived.append("activations")
            side.activations_source = "allocator peak minus " + (
                "what stays allocated between steps" if side.resident is not None
                else "the model's state on the GPU")
    run_steps = steps[steps["tag"] == "step"]
    if not run_steps.empty:
        t_s = (run_steps["t_ns"].to_numpy(float) - t0) * NS
        allocated = run_steps["allocated_bytes"].to_numpy(float)
        side.over = list(zip(t_s, allocated, run_steps["reserved_bytes"].to_numpy(float),
                             strict=True))
        use = _growth_stretch(t_s, steps_of, main, t0)
        side.growth = linear_growth(_step_of(steps_of, t_s)[use], allocated[use], t_s[use],
                                    "CUDA allocated")
    return side


def _cpu_side(own: pd.DataFrame, steps_of: pd.DataFrame, main: RankSteps, t0: int) -> _Side:
    """The training process's RSS over the run, and its growth."""
    t_s, rss = own["t_s"].to_numpy(float), own["rss_bytes"].to_numpy(float)
    use = _growth_stretch(t_s, steps_of, main, t0)
    return _Side(over=[(t, r, float("nan")) for t, r in zip(t_s, rss, strict=True)],
                 growth=linear_growth(_step_of(steps_of, t_s)[use], rss[use], t_s[use], "RSS"))


def rank_memory(run: RunData, device: str, main: RankSteps, table: pd.DataFrame,
                workers: list[int], counters: GpuCounters | None, loaders: pd.DataFrame
                ) -> RankMemory | None:
    """One rank's memory, or None when nothing of it was measured."""
    parts, derived, by_dtype, optimizers = _model_state(run.rows("model_state", main.process))
    mem = run.rows("memory", main.process)
    t0 = run.record.t0_ns.get(main.node, 0)
    steps_of = table[table["rank"] == main.rank]
    host = run.host[run.host["node"] == main.node] if not run.host.empty else run.host
    own = host[host["pid"] == main.pid] if not host.empty else host
    if device == "cuda" and not mem.empty:
        side = _gpu_side(mem, parts, derived, by_dtype, steps_of, main, t0)
    elif device != "cuda" and not own.empty:
        side = _cpu_side(own, steps_of, main, t0)
    else:
        side = _Side()
    if not parts and not side.allocator and own.empty:
        return None
    peak, peak_source, capacity, capacity_source = _peak_and_capacity(
        run, device, side.allocator, own, host, workers, counters, main.rank)
    return RankMemory(
        rank=main.rank, node=main.node, device=device, parts=parts, derived=tuple(derived),
        by_dtype=by_dtype, optimizers=optimizers,
        activations_source="saved for backward" if "activations" in parts and
        "activations" not in derived else side.activations_source,
        resident_bytes=side.resident, allocator=side.allocator, peak_bytes=peak,
        peak_source=peak_source, capacity_bytes=capacity, capacity_source=capacity_source,
        growth=side.growth, batch_size=_batch_size(loaders, main.rank),
        over_run=_thin(side.over))


def _peak_and_capacity(run: RunData, device: str, allocator: Mapping[str, float],
                       own: pd.DataFrame, host: pd.DataFrame, workers: list[int],
                       counters: GpuCounters | None, rank: int
                       ) -> tuple[float | None, str, float | None, str]:
    if device == "cuda":
        gpu = counters.of_rank(rank) if counters is not None else None
        peak = allocator.get("reserved_peak_bytes")
        source = "CUDA reserved"
        if gpu is not None and np.isfinite(gpu.mem_used_max_bytes) and (
                peak is None or gpu.mem_used_max_bytes > peak):
            peak, source = gpu.mem_used_max_bytes, "NVML used (every process on the GPU)"
        if "device_total_bytes" in allocator:
            return peak, source, allocator["device_total_bytes"], "the GPU's memory"
        if gpu is not None and np.isfinite(gpu.mem_total_bytes):
            return peak, source, gpu.mem_total_bytes, "the GPU's memory (NVML)"
        return peak, source, None, ""
    if own.empty:
        return None, "", None, ""
    peak = float(own["rss_bytes"].max())
    for pid in workers:
        rows = host[host["pid"] == pid]
        private = rows["private_bytes"].to_numpy(float)
        private = private[np.isfinite(private)]
        rss = rows["rss_bytes"].to_numpy(float)
        peak += float(private.max()) if len(private) else float(rss.max()) if len(rss) else 0.0
    source = "RSS of the training process" + (
        " and its DataLoader workers' own memory" if workers else "")
    capacity = float(run.record.memory_bytes) if run.record.memory_bytes else None
    return peak, source, capacity, "the memory the job may use (RAM or container limit)"


def memory_evidence(run: RunData, device: str, ranks: Mapping[int, RankSteps],
                    table: pd.DataFrame, workers: Mapping[int, list[int]],
                    counters: GpuCounters | None, loaders: pd.DataFrame,
                    world_size: int | None) -> MemoryEvidence | None:
    """Every rank's memory (see the module docstring); None when nothing was measured."""
    found = {rank: m for rank, main in sorted(ranks.items()) if (m := rank_memory(
        run, device, main, table, workers.get(rank, []), counters, loaders)) is not None}
    if device != "cuda":  # the machine's memory is shared by its ranks
        by_node: dict[int, float] = {}
        for m in found.values():
            by_node[m.node] = by_node.get(m.node, 0.0) + (m.peak_bytes or 0.0)
        found = {r: replace(m, machine_peak_bytes=by_node[m.node]) for r, m in found.items()}
    grown = [g for rank, main in sorted(ranks.items())
             if (g := worker_growth(rank, _worker_readings(run, main, workers.get(rank, []))))]
    if not found and not grown:
        return None
    return MemoryEvidence(ranks=found, workers=tuple(grown), world_size=world_size or 1)


def _worker_readings(run: RunData, main: RankSteps, pids: list[int]
                     ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(seconds, own bytes, RSS) of each worker, in time order: the parent's readings, and
    what the worker recorded itself as it started and as it ended (a worker that lives for
    less than the parent's interval between readings still has two)."""
    host = run.host[run.host["node"] == main.node] if not run.host.empty else run.host
    procs = run.processes[run.processes["node"] == main.node]
    t0 = run.record.t0_ns.get(main.node, 0)
    out = []
    for pid in pids:
        rows = host[host["pid"] == pid]
        t, own, rss = (rows["t_s"].to_numpy(float), rows["private_bytes"].to_numpy(float),
                       rows["rss_bytes"].to_numpy(float))
        mine = procs[procs["pid"] == pid]
        if len(mine):
            row = mine.iloc[0]
            for when in ("start", "end"):
                if np.isfinite(row[f"{when}_private_bytes"]):
                    t = np.append(t, (row[f"{when}_memory_ns"] - t0) * NS)
                    own = np.append(own, row[f"{when}_private_bytes"])
                    rss = np.append(rss, row[f"{when}_rss_bytes"])
        order = np.argsort(t, kind="stable")
        out.append((t[order], own[order], rss[order]))
    return out
