"""Pipelining probe: the pipeline schedules the job builds (``torch.distributed.pipelining``), for
the analysis of its stages' bubble (doctor.analyse.bubble).

Once the job imports ``torch.distributed.pipelining`` (never before: the probe waits for the
job's own import), it wraps the constructors of the two schedule bases, ``PipelineScheduleSingle``
(GPipe, 1F1B: one stage a rank) and ``PipelineScheduleMulti`` (interleaved, looped, zero-bubble:
several stages a rank), which every schedule class runs: each schedule built is noted with its
class, its micro-batches, the pipeline's number of stages, the indices of the stages this rank
holds and the bytes of their parameters. Nothing runs per step; the schedules go to meta.json
(``pipeline``) when the profiler window ends and at exit.

Runs inside the job at construction time only; a failure records nothing and never stops the
job (the wrapped constructor's own result and errors pass through untouched).
"""

from __future__ import annotations

import functools
from typing import Any

from ..record.session import Session
from .on_import import OnImportProbe

PACKAGE = "torch.distributed.pipelining"
BASES = ("PipelineScheduleSingle", "PipelineScheduleMulti")
MAX_SCHEDULES = 8  # schedules kept a process (the training one is built first)


class PipeliningProbe(OnImportProbe):
    name = "pipelining"
    module = PACKAGE

    def __init__(self, session: Session) -> None:
        super().__init__(session)
        self.schedules: list[dict[str, Any]] = []

    def wrap(self) -> None:
        for name in BASES:
            self.wrap_init(PACKAGE + ".schedules", name, self.wrapped_init)

    def wrapped_init(self, orig: Any) -> Any:
        """``orig`` (a schedule base's constructor), noting each schedule it builds."""

        @functools.wraps(orig)
        def __init__(this: Any, *args: Any, **kwargs: Any) -> None:
            orig(this, *args, **kwargs)
            try:
                if len(self.schedules) < MAX_SCHEDULES:
                    self.schedules.append(described(this))
            except Exception as err:
                self.session.swallowed(self.name, "reading a pipeline schedule", err)

        return __init__

    def record(self) -> None:
        if not self.session.recording or not self.schedules:
            return
        try:
            self.session.update_meta(pipeline={"schedules": list(self.schedules)})
        except Exception as err:
            self.session.swallowed(self.name, "writing the pipeline schedules", err)


def described(schedule: Any) -> dict[str, Any]:
    """A schedule as the analysis needs it: class, micro-batches, stages in all, this rank's
    stages and the bytes of their parameters."""
    stages = list(getattr(schedule, "_stages", None) or [])
    one = getattr(schedule, "_stage", None)
    if one is not None and not stages:
        stages = [one]
    indices = [int(s.stage_index) for s in stages if hasattr(s, "stage_index")]
    nbytes = 0
    for s in stages:
        module = getattr(s, "submod", None)
        if module is not None:
            nbytes += sum(p.numel() * p.element_size() for p in module.parameters())
    total = getattr(schedule, "_num_stages", None)
    if total is None and stages:
        total = getattr(stages[0], "num_stages", None)
    return {"schedule": type(schedule).__name__,
            "n_microbatches": int(getattr(schedule, "_n_microbatches", 0) or 0),
            "num_stages": int(total) if total is not None else None,
            "stages": indices, "stage_bytes": nbytes}
