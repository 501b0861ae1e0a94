"""The evidence stage: what the rules read, one typed record (Evidence), from the run and the
stages before it. Nothing here decides anything; it gathers and types.

Frames are those of the analysis (the ledger's analysed steps, the parent's samples, the
profiler window's steps, allocator snapshots, loader settings); the records are what the
stages worked out. A rule names the fields it needs; a field that is None (or an empty frame)
is missing, and the rule is skipped with that reason.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields

import pandas as pd

from doctor.analyse.comms import CommModel
from doctor.analyse.contention import Span, cores_used, within
from doctor.analyse.distributed import StragglerSearch, search_stragglers
from doctor.analyse.gpus import GpuCounters, said_cuda
from doctor.analyse.memory import MemoryEvidence
from doctor.analyse.ops import RankOps
from doctor.analyse.split import (
    InputSplit,
    OutsideLoader,
    OutsideShares,
    StageSplit,
    outside_evidence,
    split_evidence,
)
from doctor.analyse.steps import WINDOW, RankSteps, analysed
from doctor.analyse.window_drift import WindowDrift
from doctor.store.rundata import TRACE, RunData, of_process, of_processes


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


@dataclass(frozen=True)
class Evidence:
    """Everything a rule may read (see the module docstring).

    - ``ledger``: one row per analysed (rank, step), seconds per category (doctor.analyse.ledger)
      and its evidence columns (``wait_s``, ``contention_s``, ``backward_s``, ...);
    - ``host``/``system``: the parent's samples of the job's processes and of the machine;
    - ``window``: the profiler window's steps (doctor.trace.steps.STEP_COLUMNS, ``analyzed``);
    - ``memory``: CUDA allocator snapshots; ``loaders``: DataLoader settings, one row per loader;
    - ``input_split``/``outside_loader``: the input split by stage (None: not measured, and
      ``unsplit_reason`` says why); ``stragglers``: the straggler search (two ranks or more);
    - ``fd_handoff_s``: a worker-to-training tensor round trip on this machine;
      ``main_cpu_cores``/``worker_cpu_cores``: cores the training process (mean per rank) and
      the DataLoader workers (summed) kept busy during the analysed steps;
    - ``traces``: the trace files, when traces are analysed on their own;
    - ``gpus``: NVML's counters over the analysed steps, per GPU, and each rank's GPU
      (doctor.analyse.gpus; a GPU job only);
    - ``memory_use``: where each rank's memory goes, its capacity and headroom, growth over the
      run, DataLoader workers' growth (doctor.analyse.memory);
    - ``ops``: each rank's ops against the roofline (doctor.analyse.ops), where its window
      recorded ops;
    - ``comm_models``: each rank's communication model and its what-ifs (doctor.analyse.comms),
      where its window recorded all-reduces of known size;
    - ``window_drift``: each rank's median step before the profiler window and after it
      (doctor.analyse.window_drift), where both sides have enough analysed steps.
    """

    job: JobFacts = field(default_factory=JobFacts)
    ledger: pd.DataFrame | None = None
    host: pd.DataFrame | None = None
    system: pd.DataFrame | None = None
    window: pd.DataFrame | None = None
    memory: pd.DataFrame | None = None
    loaders: pd.DataFrame | None = None
    input_split: InputSplit | None = None
    unsplit_reason: str = ""
    outside_loader: OutsideLoader | None = None
    stragglers: StragglerSearch | None = None
    fd_handoff_s: float | None = None
    main_cpu_cores: float | None = None
    worker_cpu_cores: float | None = None
    traces: tuple[str, ...] | None = None
    gpus: GpuCounters | None = None
    memory_use: MemoryEvidence | None = None
    ops: Mapping[int, RankOps] | None = None
    comm_models: Mapping[int, CommModel] | None = None
    window_drift: tuple[WindowDrift, ...] | None = None

    def missing(self, needs: Iterable[str]) -> list[str]:
        known = {f.name for f in fields(self)}
        out = []
        for name in needs:
            if name not in known:
                raise AttributeError(f"a rule needs {name!r}, which is not evidence")
            value = getattr(self, name)
            if value is None or (isinstance(value, pd.DataFrame) and value.empty):
                out.append(name)
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
    )


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


def build_evidence(run: RunData, job: JobFacts, ranks: dict[int, RankSteps],
                   workers: dict[int, list[int]], ledger: pd.DataFrame, window: pd.DataFrame,
                   loaders: pd.DataFrame,
                   splits: dict[int, StageSplit], outside: dict[int, OutsideShares],
                   span: Span | None, ranged: bool, unsplit_reason: str,
                   gpus: GpuCounters | None = None,
                   memory_use: MemoryEvidence | None = None,
                   ops: Mapping[int, RankOps] | None = None,
                   comm_models: Mapping[int, CommModel] | None = None) -> Evidence:
    """The evidence of the run; ``workers`` the DataLoader workers of each rank, ``window``
    marked analysed (window_analysed), ``loaders`` of the training processes
    (training_loaders), ``gpus`` the GPU counters of a GPU job (doctor.analyse.gpus),
    ``memory_use`` where the memory goes (doctor.analyse.memory)."""
    steady = analysed(ledger)
    host = within(run.host, span) if ranged else run.host
    system = within(run.system, span) if ranged else run.system
    return Evidence(
        job=job, ledger=steady, host=host, system=system,
        window=window, memory=of_processes(run.memory, (r.process for r in ranks.values())),
        loaders=loaders,
        input_split=split_evidence(splits), unsplit_reason=unsplit_reason,
        outside_loader=outside_evidence(outside),
        stragglers=search_stragglers(steady, host, job.rank_pids) if len(ranks) > 1 else None,
        fd_handoff_s=run.record.fd_handoff_s,
        main_cpu_cores=cores_used(run.host, [(r.node, r.pid) for r in ranks.values()], span),
        worker_cpu_cores=cores_used(run.host, [(r.node, p) for rank, r in ranks.items()
                                               for p in workers[rank]], span, total=True),
        traces=tuple(run.record.source.split(", ")) if run.record.kind == TRACE else None,
        gpus=gpus, memory_use=memory_use, ops=ops or None, comm_models=comm_models or None,
    )


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
