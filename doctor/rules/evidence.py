"""The evidence the rules read: one typed record, built by doctor.analyse.evidence.

Frames are those of the analysis (the ledger's analysed steps, the parent's samples, the
profiler window's steps, allocator snapshots, loader settings); the records below are what the
stages worked out. A rule names the fields it needs; a field that is None (or an empty frame)
is missing, and the rule is skipped with that reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:
    from doctor.analyse.comms import CommModel
    from doctor.analyse.gpus import GpuCounters
    from doctor.analyse.memory import MemoryEvidence
    from doctor.analyse.ops import RankOps
    from doctor.analyse.window_drift import WindowDrift

HOST_CONTENTION = "host contention"


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
class InputSplit:
    """Where the loading time went, from stack samples (only when some were in the loading)."""

    stage_shares: Mapping[str, float]  # io, decode, preprocess: fractions of loading time
    top: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # stage -> top functions
    processes_sampled: int = 1
    recorders: tuple[str, ...] = ()
    collate_share_of_fetch: float | None = None  # collate_fn's part of the fetch time


@dataclass(frozen=True)
class OutsideLoader:
    """Batches built in the training loop itself (no DataLoader), from the main's samples."""

    stage_shares_of_step: Mapping[str, float]
    top: tuple[str, ...] = ()


@dataclass(frozen=True)
class Straggler:
    """One rank that the others wait for."""

    rank: int
    extra_s: float  # median extra non-communication seconds per step, vs the other ranks
    step_s: float  # median step wall time over the compared ranks and steps
    slower_fraction: float  # share of the shared steps in which it was slower than the others
    steps: int  # shared steps compared
    cause: str  # input | transfer | compute | other | host contention
    cause_category: str  # the ledger category with the most extra time
    extra_by_category: dict[str, float] = field(default_factory=dict)  # mean s/step vs others
    waiting: dict[int, float] = field(default_factory=dict)  # rank -> extra comm s/step
    cpu_extra_s: float | None = None  # its CPU seconds per step above the others', if sampled


@dataclass(frozen=True)
class StragglerSearch:
    """The stragglers found, and a rank that looked slower only through the profiler window's
    split (a few steps) but not step by step: noise, or extra work inside backward()."""

    stragglers: list[Straggler]
    window_only: dict[int, float] = field(default_factory=dict)  # rank -> extra s/step


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
