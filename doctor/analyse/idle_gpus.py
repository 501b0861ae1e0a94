"""A CPU job on a machine with GPUs: the GPUs NVML saw while the job ran, how busy anything kept
them, and what the training process's torch said of CUDA (doctor.record.process_facts: whether
``torch.cuda.is_available()``, whether CUDA was ever initialised, the torch version).

Among the commonest mistakes there are: torch is a CPU build (or cannot reach the driver), or
the model and its batches never moved to the GPU. The two are told apart by
``torch.cuda.is_available()``. Nothing here decides anything: doctor.rules.idle_gpus reads it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from doctor.analyse.stages import JobFacts
from doctor.analyse.steps import RankSteps
from doctor.store.process_rows import of_processes
from doctor.store.rundata import RunData


@dataclass(frozen=True)
class IdleGpus:
    """The GPUs NVML saw on the job's machines while a job that computed on the CPU ran."""

    count: int
    names: tuple[str, ...]  # as NVML names them ("" where unknown), one per GPU
    busiest_util: float  # the busiest GPU's mean utilisation over the run (0-1), by anything
    torch_cuda: bool | None  # torch.cuda.is_available() in the training process (None: unsaid)
    torch_version: str | None
    visible_devices: str | None = None  # the job's CUDA_VISIBLE_DEVICES, when it set one

    @property
    def hidden(self) -> bool:
        """Whether the job hid every GPU from itself (CUDA_VISIBLE_DEVICES set empty)."""
        return self.visible_devices is not None and not self.visible_devices.strip(" ,")


def idle_gpus(run: RunData, job: JobFacts, ranks: Mapping[int, RankSteps]) -> IdleGpus | None:
    """What NVML saw beside a CPU job whose training processes are ``ranks`` (None: a GPU job,
    a trace, or no GPU sampled)."""
    if job.device != "cpu" or job.kind == "trace" or run.gpu.empty:
        return None
    if not any(len(r.ends_ns) for r in ranks.values()):
        return None  # no step ran: nothing computed anywhere, on the CPU or not (a job that died)
    util = run.gpu.groupby(["node", "gpu"])["util_pct"].mean()
    count = len(util)
    if not count:
        return None
    busiest = float(util.max()) / 100.0
    info = {(int(g.get("node", 0)), int(g.get("index", -1))): g for g in run.record.gpus}
    names = tuple(str(info.get((int(n), int(i)), {}).get("name") or "") for n, i in util.index)
    mains = of_processes(run.processes, [r.process for r in ranks.values()])
    said = mains["cuda"].dropna() if "cuda" in mains else pd.Series(dtype=object)
    torch_cuda = bool(said.astype(bool).any()) if len(said) else None
    return IdleGpus(count=count, names=names,
                    busiest_util=busiest if not math.isnan(busiest) else 0.0,
                    torch_cuda=torch_cuda, torch_version=job.torch_version,
                    visible_devices=run.record.visible_devices)
