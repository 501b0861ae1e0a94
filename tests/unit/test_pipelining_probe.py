"""The pipelining probe (doctor.probes.pipelining) around stand-ins for a schedule base and its
stage, in a real Session on a fake clock: each schedule built is noted with its class,
micro-batches, stages and this rank's stage, in meta.json, then in the run's ``pipeline`` frame
and the job's parallelism."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from torch import nn

from doctor.analyse.parallelism import parallelism
from doctor.probes.pipelining import PipeliningProbe
from doctor.record.session import Session
from doctor.store.meta_rows import pipeline_rows
from doctor.store.process_meta import read_meta
from tests.support import FakeClock


class Stage:
    def __init__(self, index: int, num_stages: int) -> None:
        self.stage_index, self.num_stages = index, num_stages
        self.submod = nn.Linear(8, 8)


class ScheduleSingle:
    def __init__(self, stage: Stage, n_microbatches: int, **kwargs: Any) -> None:
        self._stage, self._n_microbatches = stage, n_microbatches
        self._num_stages = stage.num_stages


class ScheduleGPipe(ScheduleSingle):
    pass


def test_each_schedule_is_noted_with_its_stages(tmp_path: Path) -> None:
    session = Session(tmp_path, clock=FakeClock(), window_start=10**9)
    probe = PipeliningProbe(session)
    orig = ScheduleSingle.__init__
    ScheduleSingle.__init__ = probe.wrapped_init(orig)  # type: ignore[method-assign]
    try:
        schedule = ScheduleGPipe(Stage(1, 2), n_microbatches=4)
    finally:
        ScheduleSingle.__init__ = orig  # type: ignore[method-assign]
    assert schedule._n_microbatches == 4  # the job's own object, as built
    session.record_optimizer_start()  # a step: the process records from now on
    session.record_optimizer_end(0)
    probe.record()
    directory = session.directory
    session.close()
    [row] = pipeline_rows({"node": 0, "rank": 1, "pid": 1}, read_meta(directory))
    assert (row["schedule"], row["microbatches"], row["stages"]) == ("ScheduleGPipe", 4, 2)
    assert row["stage_indices"] == "1" and row["stage_bytes"] == (8 * 8 + 8) * 4
    par = parallelism(pd.DataFrame(), {}, 2, False, None, pd.DataFrame([row]))
    assert par.describe() == "pipeline: 2 stages, GPipe, 4 micro-batches"
    assert par.kinds == ("pipeline",)


def test_the_probe_waits_for_the_jobs_own_import(tmp_path: Path) -> None:
    import sys

    session = Session(tmp_path, clock=FakeClock())
    probe = PipeliningProbe(session)
    had = "torch.distributed.pipelining" in sys.modules
    probe.start()
    try:
        assert ("torch.distributed.pipelining" in sys.modules) == had  # nothing imported
    finally:
        probe.stop()
        session.close()
