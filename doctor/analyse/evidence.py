"""The evidence stage: what the rules read (doctor.rules.evidence.Evidence), from the run and
the stages before it. Nothing here decides anything; it gathers and types."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import pandas as pd

from doctor.analyse.comms import CommModel
from doctor.analyse.contention import Span, cores_used, within
from doctor.analyse.distributed import search_stragglers
from doctor.analyse.gpus import GpuCounters, said_cuda
from doctor.analyse.memory import MemoryEvidence
from doctor.analyse.ops import RankOps
from doctor.analyse.split import OutsideShares, StageSplit, outside_evidence, split_evidence
from doctor.analyse.steps import WINDOW, RankSteps, analysed
from doctor.rules.evidence import Evidence, JobFacts
from doctor.store.rundata import TRACE, RunData, of_process, of_processes


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
        traces=run.record.sources if run.record.kind == TRACE else None,
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
