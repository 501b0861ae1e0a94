"""The analyse stages' view of the job: what the job is (JobFacts), which DataLoaders the
training processes used, and which of the profiler window's steps are analysed."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

import pandas as pd

from doctor.analyse.gpus import said_cuda
from doctor.analyse.steps import WINDOW, RankSteps
from doctor.store.rundata import RunData, of_process, of_processes


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
