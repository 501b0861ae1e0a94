"""The analyse stages, in their order, over one RunData: ``run_stages`` -> Stages, the one
record of what they worked out, from which the evidence (doctor.analyse.evidence) and the verdict
(doctor.pipeline) are built.

    steps -> phases -> window fractions (or GPU counters) -> input split -> contention
          -> ledger -> memory -> ops -> communication -> the window's drift

Also here: what the job is (JobFacts), which DataLoaders the training processes used, and which
of the profiler window's steps are analysed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

import pandas as pd

from doctor.analyse.comms import (
    CommModel,
    RankComms,
    comm_models,
    comms_evidence,
    comms_parallelism,
    inter_node_link,
)
from doctor.analyse.contention import (
    COMMUNICATION,
    INPUT,
    Span,
    analysed_span,
    core_contention,
)
from doctor.analyse.gpu_split import counter_splits
from doctor.analyse.gpus import GpuCounters, gpu_counters, said_cuda
from doctor.analyse.ledger import build_ledger
from doctor.analyse.memory import MemoryEvidence, memory_evidence
from doctor.analyse.ops import RankOps, ops_evidence
from doctor.analyse.parallelism import Parallelism
from doctor.analyse.periods import (
    PeriodStart,
    first_period,
    later_input_splits,
    later_splits,
    ledger_by_period,
    period_starts,
)
from doctor.analyse.phase_steps import mark_phases
from doctor.analyse.phases import RankPhases, find_phases, on_ledger
from doctor.analyse.precision import Precision, job_precision
from doctor.analyse.split import OutsideShares, StageSplit, outside_loader, rank_split
from doctor.analyse.step_table import analysed, step_table
from doctor.analyse.steps import (
    WINDOW,
    RankSteps,
    step_range,
    training_processes,
    workers_by_parent,
)
from doctor.analyse.window import WindowSplit, window_frame, window_splits
from doctor.analyse.window_drift import WindowDrift, fault_rates, window_drift
from doctor.store.process_rows import of_process, of_processes
from doctor.store.rundata import RunData


@dataclass(frozen=True)
class JobFacts:
    """What the job is, as far as it is known (None: not known, e.g. for a trace alone)."""

    kind: str = "run"  # run | watch | trace
    device: str = "cpu"  # cpu | cuda
    cores: int | None = None  # usable by the job's processes
    torch_threads: int | None = None  # intra-op threads of the training process
    torch_version: str | None = None
    world_size: int | None = None  # ranks of the job, when known
    ranks: int = 1  # ranks analysed
    ranks_here: int = 1  # training processes on one machine (the most on any node)
    worker_processes: int = 0  # DataLoader workers seen
    rank_pids: Mapping[int, int] = field(default_factory=dict)  # rank -> training process
    # the 16-bit type the device runs fast (doctor.analyse.precision)
    precision: Precision = field(default_factory=lambda: Precision(None, "not known"))
    # the framework that steps the optimizer (doctor.rules.frameworks: hf_trainer, lightning,
    # fabric, accelerate, deepspeed), and its package's version; None: a loop of the job's own
    framework: str | None = None
    framework_version: str | None = None
    # (device, dtype) of each autocast the training processes entered (doctor.probes.amp)
    autocast: tuple[tuple[str, str], ...] = ()

    def autocasts_on(self, device: str) -> str | None:
        """The 16-bit type the job autocasts to on ``device`` already (None: none)."""
        return next((dtype for dev, dtype in self.autocast if dev == device), None)


@dataclass(frozen=True)
class Stages:
    """What the analyse stages worked out for one run, in the order they run (run_stages)."""

    ranks: dict[int, RankSteps]  # rank -> its training process (doctor.analyse.steps)
    in_range: tuple[int, int] | None  # the steps asked for (first, last), or None: every step
    table: pd.DataFrame  # one row per (rank, step): its time, its waits, its phase, whether
    # analysed (training steps only)
    windows: dict[int, WindowSplit]  # each rank's profiler window's split of its step
    window_problems: dict[int, str]  # rank -> why its window gives no split
    span: Span | None  # the analysed steps' (first start, last end)
    job: JobFacts
    counters: GpuCounters | None  # NVML's counters (a GPU job only)
    coarse: dict[int, WindowSplit]  # the split the GPU counters give a rank with no window's
    coarse_notes: list[str]
    workers: dict[int, list[int]]  # rank -> its DataLoader workers' pids
    splits: dict[int, StageSplit]  # rank -> its loading time by stage, from stack samples
    outside: dict[int, OutsideShares]  # rank -> its batch building outside a DataLoader
    contention: dict[int, float]  # rank -> its input wait's share lost to busy cores
    comm_contention: dict[int, float]  # rank -> its communication's share lost to busy cores
    ledger: pd.DataFrame  # seconds per category of every (rank, step) (doctor.analyse.ledger)
    window: pd.DataFrame  # the profiler window's steps, each marked analysed
    loaders: pd.DataFrame  # the training processes' DataLoader settings
    memory: MemoryEvidence | None
    ops: dict[int, RankOps]
    comms: dict[int, RankComms]
    models: dict[int, CommModel]
    drifts: tuple[WindowDrift, ...]  # each rank's median step before the window and after it
    phases: dict[int, RankPhases] = field(default_factory=dict)  # evaluation, checkpoints,
    # epoch starts of each rank, on the ledger's clock (doctor.analyse.phases)
    #: rank -> where each later window's period begins (doctor.analyse.periods)
    period_starts: dict[int, list[PeriodStart]] = field(default_factory=dict)
    parallelism: Parallelism | None = None  # what the collectives serve (analyse.parallelism)


def run_stages(run: RunData, steps: tuple[int | None, int | None] | None = None) -> Stages:
    """The stages over ``run``; ``steps`` (first, last), 1-based, inclusive, either open,
    analyses only the steps in that range (the ledger keeps the others) and the samples of
    their span."""
    ranks = training_processes(run)
    in_range = step_range(steps, ranks)
    phases = run_phases(run, ranks)
    table = mark_phases(step_table(run, ranks, in_range), phases)
    window = window_frame(run, ranks)
    windows, window_problems = window_splits(run, ranks)
    span = analysed_span(analysed(table))
    job = job_facts(run, ranks, window)
    counters = gpu_counters(run, ranks, table) if job.device == "cuda" else None
    coarse, coarse_notes = counter_splits(counters, ranks, table, windows)
    children = workers_by_parent(run)
    workers = {rank: children.get(main.process, []) for rank, main in ranks.items()}
    splits = {rank: rank_split(run, main, workers[rank]) for rank, main in ranks.items()}
    outside = outside_loader(run, ranks)
    cores = core_contention(run.host, run.system, table, workers, ranks, span)
    contention = {r: c[INPUT] for r, c in cores.items() if INPUT in c and workers.get(r)}
    comm_contention = {r: c[COMMUNICATION] for r, c in cores.items() if COMMUNICATION in c}
    fractions = {r: f for r, s in splits.items() if (f := s.fractions) is not None}

    def build(table: pd.DataFrame, windows: Mapping[int, WindowSplit],
              inputs: Mapping[int, Mapping[str, float]]) -> pd.DataFrame:
        return build_ledger(table, windows, {**fractions, **inputs},
                            {r: o.shares for r, o in outside.items()}, contention,
                            comm_contention, cpu=job.device != "cuda")

    # each later window splits the steps of its own period (doctor.analyse.periods)
    starts = period_starts(run, ranks)
    ledger = ledger_by_period(build(table, {**windows, **coarse}, {}), table, starts,
                              later_splits(run, ranks), later_input_splits(run, ranks, workers),
                              {**windows, **coarse}, build)
    window, loaders = window_analysed(window, ranks, ledger), training_loaders(run, ranks)
    memory = memory_evidence(run, job.device, ranks, table, workers, counters, loaders,
                             job.world_size)
    ops = ops_evidence(run, job.device, ranks, window, counters)
    comms = comms_evidence(run, ranks, window)
    micro = backward_calls(ledger)
    models = comm_models(run, comms, window, job, inter_node_link(run.record), micro)
    # before the first window vs after it, in its own period
    drifts = window_drift(first_period(ledger, starts), fault_rates(run, ranks))
    return Stages(
        ranks=ranks, in_range=in_range, table=table, windows=windows,
        window_problems=window_problems, span=span, job=job, counters=counters, coarse=coarse,
        coarse_notes=coarse_notes, workers=workers, splits=splits, outside=outside,
        contention=contention, comm_contention=comm_contention, ledger=ledger, window=window,
        loaders=loaders, memory=memory, ops=ops, comms=comms, models=models, drifts=drifts,
        phases=phases, period_starts=starts,
        parallelism=comms_parallelism(comms, job.world_size, not run.ddp.empty, run.sharding,
                                      run.pipeline)
        if comms or not run.sharding.empty or not run.pipeline.empty else None)


def run_phases(run: RunData, ranks: dict[int, RankSteps]) -> dict[int, RankPhases]:
    """Each rank's phases (doctor.analyse.phases), on the ledger's clock."""
    out = {}
    for rank, r in ranks.items():
        found = find_phases(run, r)
        origin = run.record.t0_ns.get(r.node, 0)
        out[rank] = RankPhases(rank, {k: on_ledger(p, origin) for k, p in found.phases.items()},
                               found.train_loader, found.logging)
    return out


def job_facts(run: RunData, ranks: dict[int, RankSteps], window: pd.DataFrame) -> JobFacts:
    procs = run.processes
    mains = of_processes(procs, (r.process for r in ranks.values()))
    first = mains.sort_values("rank").iloc[0] if not mains.empty else None
    workers = procs[procs["role"].astype(str).str.startswith("worker")]
    worlds = mains["world_size"].dropna()
    if len(worlds):
        world: int | None = int(worlds.max())
    else:  # one process of a job doctor ran is a world of one; a trace alone may not say
        world = (len(ranks) or None) if run.record.job_seen else None
    cores = run.record.cores or (_int(first["cores"]) if first is not None else None)
    cuda = used_cuda(run, mains) or bool((window["device"] == "cuda").any())
    return JobFacts(
        kind=run.record.kind, device="cuda" if cuda else "cpu", cores=cores,
        torch_threads=_int(first["torch_threads"]) if first is not None else None,
        torch_version=first["torch_version"] if first is not None else None,
        world_size=world, ranks=len(ranks),
        ranks_here=max(Counter(r.node for r in ranks.values()).values(), default=1),
        worker_processes=len(workers), rank_pids={rank: r.pid for rank, r in ranks.items()},
        precision=job_precision(run, "cuda" if cuda else "cpu", window),
        framework=_text(first, "framework"), framework_version=_text(first, "framework_version"),
        autocast=_autocasts(of_processes(run.amp, (r.process for r in ranks.values()))),
    )


def _text(row: pd.Series | None, column: str) -> str | None:
    value = row.get(column) if row is not None else None
    return value if isinstance(value, str) and value else None


def _autocasts(amp: pd.DataFrame) -> tuple[tuple[str, str], ...]:
    """Each enabled autocast's (device, dtype), in the order first entered."""
    on = amp[(amp["kind"] == "autocast") & (amp["enabled"] == True)]  # noqa: E712
    return tuple(dict.fromkeys(zip(on["device"].astype(str), on["dtype"].astype(str),
                                   strict=True)))


def used_cuda(run: RunData, mains: pd.DataFrame) -> bool:
    """Whether the training processes computed on a GPU: one initialised CUDA (as it said at
    its exit) or NVML saw it on a GPU; for a process that did not say (a crash, an older
    doctor), whether torch saw a GPU at all."""
    procs = run.gpu_procs
    if not procs.empty and any(((procs["node"] == n) & (procs["pid"] == p)).any()
                               for n, p in zip(mains["node"], mains["pid"], strict=True)):
        return True
    return any(said_cuda(row) for _, row in mains.iterrows())


def _int(value: object) -> int | None:
    return None if value is None or pd.isna(value) else int(value)  # type: ignore[call-overload]


def training_loaders(run: RunData, ranks: dict[int, RankSteps]) -> pd.DataFrame:
    """The DataLoader settings the training processes recorded (lowest rank first)."""
    rows = of_processes(run.loaders, (r.process for r in ranks.values()))
    return rows.sort_values(["rank", "id"], kind="stable").drop(columns=["node", "pid"]) \
        .reset_index(drop=True)


def window_analysed(window: pd.DataFrame, ranks: dict[int, RankSteps],
                    ledger: pd.DataFrame) -> pd.DataFrame:
    """The window's steps, each marked analysed: all of a window beside the steps it profiled;
    for steps that are the window's own, as the ledger marks them (warm-up left out)."""
    out = window.assign(analyzed=True)
    for rank, steps in ranks.items():
        if steps.kind != WINDOW:
            continue
        flags = ledger.loc[ledger["rank"] == rank, "analyzed"].to_numpy()
        mine = out.index.isin(of_process(out, steps.process).index)
        if mine.sum() == len(flags):
            out.loc[mine, "analyzed"] = flags
    return out


def backward_calls(ledger: pd.DataFrame) -> dict[int, float]:
    """Each rank's median backward() calls a step (its micro-batches), as the ledger counts."""
    if ledger.empty or not {"rank", "micro_batches"} <= set(ledger):
        return {}
    medians = ledger.groupby("rank")["micro_batches"].median()
    return {int(str(r)): float(m) for r, m in medians.items()}
