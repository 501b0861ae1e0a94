"""What the reports format (Analysis): the verdict, the ledger behind it, where it came from,
and the analyse stages' records beside the verdict, typed (Sections), with the report's tables
(Tables). Nothing here is a dict keyed by name: reports/json.py alone turns the sections into
verdict.json's dicts, and the renderers read these fields and format them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

import pandas as pd

from doctor.analyse.causes import SlowSteps
from doctor.analyse.comms import CommModel, RankComms
from doctor.analyse.gc_pauses import GcSummary
from doctor.analyse.gpus import GpuCounters
from doctor.analyse.kind_scaling import KindScaling
from doctor.analyse.ledger import StepMarks, step_marks
from doctor.analyse.memory import MemoryEvidence
from doctor.analyse.ops import RankOps
from doctor.analyse.phase_steps import PhaseSummary
from doctor.analyse.shard_phases import ShardPhases
from doctor.analyse.whole_run import WholeRun
from doctor.verdict import Verdict


@dataclass(frozen=True)
class Sections:
    """The analyse stages' records the reports show beside the verdict (verdict.json's
    ``gpus``, ``memory``, ``ops``, ``communication``, ``comm_model``, ``scaling``,
    ``slow_steps`` and ``gc``); by rank, lowest first; None or empty where the run has none."""

    counters: GpuCounters | None = None  # NVML's counters per GPU (a GPU job)
    memory: MemoryEvidence | None = None  # where each rank's memory goes
    ops: Mapping[int, RankOps] = field(default_factory=dict)  # each rank's ops and roofs
    comms: Mapping[int, RankComms] = field(default_factory=dict)  # each rank's collectives
    models: Mapping[int, CommModel] = field(default_factory=dict)  # its communication model
    slow_steps: SlowSteps | None = None  # each slow step's cause, grouped by cause
    gc: Mapping[int, GcSummary] = field(default_factory=dict)  # each rank's collections
    phases: tuple[PhaseSummary, ...] = ()  # evaluation, checkpoints, epoch starts per rank
    whole_run: WholeRun | None = None  # every step of a long run, in buckets (the step chart)
    scaling: KindScaling | None = None  # the step at more ranks, the job's own kind's model
    #: a sharded job's collectives by phase and unit (doctor.analyse.shard_phases)
    shard_phases: Mapping[int, ShardPhases] = field(default_factory=dict)

    def first_ops(self) -> RankOps | None:
        """The lowest rank's ops (the report shows that rank's)."""
        return next(iter(self.ops.values()), None)


@dataclass(frozen=True)
class Tables:
    """The report's tables, in the order it shows them; None: the run has none of it."""

    top_functions: pd.DataFrame | None = None  # the loading time by function
    ranks: pd.DataFrame | None = None  # per rank: step time and shares
    loaders: pd.DataFrame | None = None  # the training processes' DataLoader settings
    processes: pd.DataFrame | None = None  # CPU, memory and reads per process
    gpu_steps: pd.DataFrame | None = None  # the profiler window's steps
    gpus: pd.DataFrame | None = None  # per GPU over the analysed steps
    gpu_over_run: pd.DataFrame | None = None  # per GPU over the run, in tenths
    memory: pd.DataFrame | None = None  # per rank: where the memory goes
    memory_over_run: pd.DataFrame | None = None  # each rank's memory over the run (a chart)
    ops: pd.DataFrame | None = None  # the lowest rank's top ops
    communication: pd.DataFrame | None = None  # every rank's collectives by kind
    sharded_phases: pd.DataFrame | None = None  # a sharded job's collectives by phase and unit
    comm_what_if: pd.DataFrame | None = None  # what the communication model predicts

    def present(self) -> list[tuple[str, pd.DataFrame]]:
        """(name, frame) of each table the run has, in the report's order."""
        return [(f.name, frame) for f in fields(self)
                if (frame := getattr(self, f.name)) is not None]


@dataclass
class Analysis:
    """What the reports format: the verdict, the ledger behind it, and where it came from.

    ``ledger`` has LEDGER_COLUMNS (seconds; ``start_s`` from the run's start; ``warmup`` and
    ``analyzed`` are booleans) and may be empty. ``source`` is the run directory or the traces.
    """

    verdict: Verdict
    ledger: pd.DataFrame
    source: str
    tables: Tables = field(default_factory=Tables)
    sections: Sections = field(default_factory=Sections)

    def rank_count(self) -> int:
        """The ranks in the ledger (0: no ledger)."""
        ledger = self.ledger
        if ledger is None or ledger.empty or "rank" not in ledger:
            return 0
        return int(ledger["rank"].nunique())

    def has_warmup(self) -> bool:
        """Whether any step of the ledger is warm-up."""
        ledger = self.ledger
        if ledger is None or ledger.empty or "warmup" not in ledger:
            return False
        return bool(ledger["warmup"].fillna(False).astype(bool).any())

    def step_marks(self) -> StepMarks:
        """Which steps are warm-up, deep window and stack sampling (the step chart's marks)."""
        return step_marks(self.ledger)
