"""The evidence stage: what the rules read, one typed record (Evidence), from the run and the
stages before it. Nothing here decides anything; it gathers and types.

Frames are those of the analysis (the ledger's analysed steps, the parent's samples, the
profiler window's steps, allocator snapshots, loader settings); the records are what the
stages worked out. A rule names the fields it needs; a field that is None (or an empty frame)
is missing, and the rule is skipped with that reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields

import pandas as pd

from doctor.analyse.bubble import Bubble, pipeline_bubble
from doctor.analyse.causes import SlowSteps
from doctor.analyse.comms import CommModel, RankComms, inter_node_link
from doctor.analyse.compiles import Compiles, compiles
from doctor.analyse.contention import cores_used, within
from doctor.analyse.data_source import DataSource, data_source
from doctor.analyse.distributed import StragglerSearch, search_stragglers
from doctor.analyse.facts import stacks_reason
from doctor.analyse.gc_pauses import GcSummary
from doctor.analyse.gpus import GpuCounters
from doctor.analyse.idle_gpus import IdleGpus, idle_gpus
from doctor.analyse.iterations import Iterations, iterations
from doctor.analyse.kind_scaling import KindScaling, job_scaling
from doctor.analyse.memory import MemoryEvidence
from doctor.analyse.mixed import RankPrecision, precision_evidence
from doctor.analyse.ops import RankOps
from doctor.analyse.overflows import NotFound, Overflow, overflows
from doctor.analyse.parallelism import Parallelism
from doctor.analyse.phase_steps import PhaseSummary
from doctor.analyse.shard_phases import ShardPhases, shard_phases
from doctor.analyse.split import (
    InputSplit,
    OutsideLoader,
    outside_evidence,
    split_evidence,
)
from doctor.analyse.stages import JobFacts, Stages
from doctor.analyse.step_table import analysed
from doctor.analyse.window_drift import WindowDrift
from doctor.store.process_rows import of_processes
from doctor.store.rundata import TRACE, RunData


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
      ``worker_fetch_s``: the slowest DataLoader worker's mean time to build a batch (each
      worker serves every n-th batch in turn);
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
      (doctor.analyse.window_drift), where both sides have enough analysed steps;
    - ``idle_gpus``: the GPUs NVML saw beside a job that computed on the CPU
      (doctor.analyse.idle_gpus);
    - ``slow_steps``: every slow step with its cause, grouped (doctor.analyse.causes; the
      pipeline adds it: doctor.analyse.cause_sources); ``gc``: each rank's garbage collections
      (doctor.analyse.gc_pauses), where the GC probe ran;
    - ``iterations``: each rank's iterations under a GradScaler, the skipped ones and the
      micro-batches per iteration (doctor.analyse.iterations), where a scaler updated;
      ``compiles``: each rank's torch.compile compilations (doctor.analyse.compiles);
      ``overflows``: where each rank's gradients first overflowed in skipped iterations, or why
      that was not found (doctor.analyse.overflows), where the overflow watch ran;
    - ``precision``: each rank's mixed precision (its autocasts, scaler, losses not finite, the
      casts' cost: doctor.analyse.mixed), where it recorded any;
    - ``optimizers``: each training process's optimizers as they first stepped (class,
      foreach, fused, parameter tensors, device);
    - ``phases``: each rank's evaluation passes, checkpoints and epoch starts
      (doctor.analyse.phase_steps; the pipeline adds it);
    - ``bubble``: a pipeline's stages waiting for their neighbours against the schedule's
      theory (doctor.analyse.bubble), where ranks sent and received in a pipeline;
      ``scaling``: the step at more ranks for the same global batch by the model of the job's
      kind, DDP's, sharded or pipelined (doctor.analyse.kind_scaling).
    - ``data_source``: the filesystem under the job's data files, its connections and network
      bytes over the analysed steps (doctor.analyse.data_source), where the parent scanned them.
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
    worker_fetch_s: float | None = None
    traces: tuple[str, ...] | None = None
    gpus: GpuCounters | None = None
    memory_use: MemoryEvidence | None = None
    ops: Mapping[int, RankOps] | None = None
    comm_models: Mapping[int, CommModel] | None = None
    window_drift: tuple[WindowDrift, ...] | None = None
    idle_gpus: IdleGpus | None = None
    slow_steps: SlowSteps | None = None
    gc: Mapping[int, GcSummary] | None = None
    iterations: Mapping[int, Iterations] | None = None
    compiles: Mapping[int, Compiles] | None = None
    overflows: Mapping[int, Overflow | NotFound] | None = None
    precision: Mapping[int, RankPrecision] | None = None
    optimizers: pd.DataFrame | None = None
    phases: tuple[PhaseSummary, ...] | None = None
    parallelism: Parallelism | None = None
    comms: Mapping[int, RankComms] | None = None  # each rank's collectives, with their roles
    #: a sharded job's collectives by phase and unit, per rank (doctor.analyse.shard_phases)
    shard_phases: Mapping[int, ShardPhases] | None = None
    bubble: Bubble | None = None  # a pipeline's stages waiting (doctor.analyse.bubble)
    scaling: KindScaling | None = None  # the step at more ranks, the job's own kind's model
    data_source: DataSource | None = None

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


def build_evidence(run: RunData, stages: Stages) -> Evidence:
    """The evidence of the run, from what the analyse stages worked out (run_stages)."""
    ranks, span = stages.ranks, stages.span
    steady = analysed(stages.ledger)
    ranged = stages.in_range is not None
    bubble = pipeline_bubble(steady, stages.comms, stages.parallelism, run.pipeline)
    host = within(run.host, span) if ranged else run.host
    system = within(run.system, span) if ranged else run.system
    return Evidence(
        job=stages.job, ledger=steady, host=host, system=system, window=stages.window,
        memory=of_processes(run.memory, (r.process for r in ranks.values())),
        loaders=stages.loaders, input_split=split_evidence(stages.splits),
        unsplit_reason=stacks_reason(run, ranks),
        outside_loader=outside_evidence(stages.outside),
        stragglers=search_stragglers(steady, host, stages.job.rank_pids) if len(ranks) > 1
        else None,
        fd_handoff_s=run.record.fd_handoff_s,
        main_cpu_cores=cores_used(run.host, [(r.node, r.pid) for r in ranks.values()], span),
        worker_cpu_cores=cores_used(run.host, [(r.node, p) for rank, r in ranks.items()
                                               for p in stages.workers[rank]], span, total=True),
        worker_fetch_s=slowest_worker_fetch(run, stages),
        traces=run.record.sources if run.record.kind == TRACE else None,
        gpus=stages.counters, memory_use=stages.memory, ops=stages.ops or None,
        comm_models=stages.models or None, window_drift=stages.drifts or None,
        idle_gpus=idle_gpus(run, stages.job, ranks),
        iterations=iterations(run, ranks) or None,
        compiles=compiles(run, ranks, stages.table) or None,
        overflows=overflows(run, ranks) or None,
        precision=precision_evidence(run, ranks, stages.ledger, stages.ops) or None,
        optimizers=of_processes(run.optimizers, (r.process for r in ranks.values())),
        parallelism=stages.parallelism, comms=stages.comms or None,
        shard_phases=shard_phases(stages.comms) or None,
        bubble=bubble,
        scaling=job_scaling(stages.parallelism, stages.comms, stages.models, bubble,
                            inter_node_link(run.record), stages.job.ranks_here, stages.ops),
        data_source=data_source(run.fd_scans, run.mounts, span),
    )


def slowest_worker_fetch(run: RunData, stages: Stages) -> float | None:
    """The slowest DataLoader worker's mean seconds per batch (its ``fetch`` intervals), over
    every rank's workers (None: no worker recorded a batch)."""
    means = []
    for rank, main in stages.ranks.items():
        for pid in stages.workers.get(rank, []):
            t0, t1, _ = run.intervals_of((main.node, rank, pid), "fetch")
            if len(t0):
                means.append(float((t1 - t0).mean()) * 1e-9)
    return max(means) if means else None
