"""The numbers every input rule starts from, and the speedup model of loading.

Loading of one batch takes ``load`` seconds of work and overlaps the rest of the step (``rest``)
in ``k`` worker processes on ``cores`` cores:

    step ~ max(rest, load / k, (load + rest) / cores)

``load`` is the wait itself with num_workers=0, and about ``workers x step`` when ``workers``
processes together deliver one batch per step. ``step`` is the steps' pace (doctor.step_pace)
and ``rest`` the median of each step's time beside its wait, not medians subtracted: workers
that finish together hand over batches in pairs, a long wait then none, whose median step and
median wait are of different steps (a 2-worker job's own work read about 4x too long). Making a
stage cheaper removes its fraction of ``load``. With workers, ``rest`` includes the training
process's handoff of each batch: one round trip to the worker per tensor
(doctor.probes.handoff), which no cheaper stage removes.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from doctor.analyse.evidence import Evidence
from doctor.rules.base import RuleSkipped
from doctor.rules.host import other_load_cores
from doctor.step_pace import pace

MIN_OTHER_LOAD = 0.5  # cores other processes keep busy, below which they are noise


def suggested_workers(cores: float) -> int:
    """Workers to try: one per core free for the job, leaving one for the training loop on
    larger machines."""
    free = max(1, int(cores))
    return max(1, min(8, free if free <= 2 else free - 1))


def estimate_with_workers(load: float, rest: float, cores: float, workers: int,
                          waiting: float = 0.0) -> float:
    """Step time once building a batch (``load`` s) overlaps the rest of the step (``rest`` s)
    in ``workers`` processes on ``cores`` cores; the ``waiting`` fraction of the loading
    (reads from storage) blocks without holding a core."""
    cpu = load * (1.0 - min(max(waiting, 0.0), 1.0))
    return max(rest, load / max(workers, 1), (cpu + rest) / max(cores, 1), 1e-9)


def main_loader(loaders: pd.DataFrame | None) -> dict[str, Any]:
    """The settings of the loader the job iterated (the first one recorded)."""
    if loaders is None or loaders.empty:
        return {}
    return {str(k): v for k, v in loaders.iloc[0].to_dict().items()}


def batch_argument(loader: dict[str, Any]) -> str:
    """The loader's ``batch_size=`` as a fix's code writes it: its size where known (a
    framework's loader that batches through a batch sampler included), None only where the
    loader batches nothing (``batch_size=None`` turns batching off if copied)."""
    size = loader.get("batch_size")
    if isinstance(size, int | float) and size == size and size > 0:
        return f"batch_size={int(size)}"
    if loader.get("batched") is False:
        return "batch_size=None"
    return "batch_size=batch_size"


def batch_handoff(loader: dict[str, Any], fd_handoff_s: float | None) -> float:
    """Seconds the training process blocks taking one batch from a worker: a round trip per
    tensor under torch's default ``file_descriptor`` sharing, in the training thread unless a
    pin-memory thread takes the batches. 0 where not measured."""
    per_tensor, tensors = fd_handoff_s, count_of(loader.get("batch_tensors"))
    if per_tensor is None or tensors is None or pd.isna(per_tensor):
        return 0.0
    if loader.get("pin_memory") or \
            (loader.get("sharing_strategy") or "file_descriptor") != "file_descriptor":
        return 0.0
    return float(per_tensor) * tensors


def count_of(value: Any) -> int | None:
    """A count from a loader's settings (None where it was not counted)."""
    return None if value is None or pd.isna(value) else int(value)


class InputFacts:
    """The numbers every input rule starts from."""

    def __init__(self, ev: Evidence) -> None:
        ledger = ev.ledger
        assert ledger is not None
        self.wall = float(ledger["wall_s"].sum())
        if self.wall <= 0:
            raise RuleSkipped("no step time")
        self.wait_share = float(ledger["wait_s"].sum()) / self.wall
        # with workers, the training's wait for cores the workers hold is input's too
        contention: pd.Series = ledger["contention_s"] if "contention_s" in ledger \
            else pd.Series(0.0, index=ledger.index)
        self.share = self.wait_share + float(contention.sum()) / self.wall
        self.step = pace(ledger["wall_s"].tolist()) or 0.0
        self.mean_step = self.wall / len(ledger)
        self.wait = pace(ledger["wait_s"].tolist()) or 0.0
        self.rest = max(float((ledger["wall_s"] - ledger["wait_s"]).median()), 0.0)
        self.cores = ev.job.cores or 1
        # cores other processes keep busy are not the job's to give its workers
        other = other_load_cores(ev)
        self.other_load = other if other is not None and other >= MIN_OTHER_LOAD else 0.0
        self.free_cores = max(1.0, self.cores - self.other_load)
        self.loader = main_loader(ev.loaders)
        self.workers = int(self.loader.get("num_workers") or 0)
        self.batch = batch_argument(self.loader)  # the loader's batch_size=, as code says it
        self.gpu = ev.job.device == "cuda"  # GPU-only code is offered to GPU jobs only
        split = ev.input_split
        self.measured = split is not None
        self.stage_shares: dict[str, float] = dict(split.stage_shares) if split else {}
        self.top: dict[str, list[str]] = {k: list(v) for k, v in split.top.items()} if split \
            else {}
        self.collate_share = split.collate_share_of_fetch if split else None
        self.load = self.wait if self.workers == 0 else self.step * self.workers
        worker_cores = self.worker_cores = ev.worker_cpu_cores
        self.main_cores = ev.main_cpu_cores
        if self.workers and worker_cores:
            # one batch per step: the workers' CPU seconds per step are the loading's CPU work;
            # the time in reads (io), mostly spent blocked, comes on top
            reads = float(self.stage_shares.get("io", 0.0)) if self.measured else 0.0
            cpu = worker_cores * self.step
            self.load = min(self.load, cpu / max(1.0 - reads, 0.05))
        # With workers, the rest of the step shares the cores with them: its wall time is
        # inflated by the time it waited for a core the workers held (the contention). Without
        # that wait it takes at least its own CPU time, and more where it also blocks.
        main_cores = ev.main_cpu_cores
        self.contention = float(contention.median())
        self.rest_alone = self.rest
        if self.workers and main_cores:
            own = max(main_cores * self.step, 1e-9)
            self.rest_alone = min(self.rest, max(own, self.rest - self.contention))
        # Taking each batch from a worker costs the training process a round trip per tensor,
        # hidden in the wait while the workers are slow; it stays when they keep up.
        handoff = batch_handoff(self.loader, ev.fd_handoff_s)
        self.handoff = min(handoff, self.wait) if self.workers else handoff

    def step_after(self, load: float, workers: int, waiting: float = 0.0,
                   cores: float | None = None) -> float:
        """Step time with ``workers`` workers building batches of ``load`` seconds (of which
        the ``waiting`` fraction blocks in reads), on the cores other processes leave (or on
        ``cores``)."""
        return estimate_with_workers(load, self.rest_alone + self.handoff,
                                     self.free_cores if cores is None else cores, workers,
                                     waiting)

    def dominant(self) -> str:
        if not self.measured or not self.stage_shares:
            return "input"
        return max(self.stage_shares, key=lambda s: self.stage_shares[s])
