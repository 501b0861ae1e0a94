"""The sharding probe (doctor.probes.sharding) around a stand-in for FSDP2's fully_shard, in a
real Session on a fake clock: each call counted with its settings, in meta.json, then in the
run's ``sharding`` frame and the job's parallelism."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from torch import nn

from doctor.analyse.parallelism import parallelism
from doctor.probes.sharding import ShardingProbe
from doctor.record.session import Session
from doctor.store.meta_rows import sharding_rows
from doctor.store.process_meta import read_meta
from tests.support import FakeClock


def test_each_fully_shard_call_is_counted_with_its_settings(tmp_path: Path) -> None:
    session = Session(tmp_path, clock=FakeClock(), window_start=10**9)
    probe = ShardingProbe(session)
    seen: list[Any] = []

    def fully_shard(module: nn.Module, **kwargs: Any) -> nn.Module:
        seen.append(kwargs)
        return module

    wrapped = probe._fully_shard(fully_shard)
    layers = [nn.Linear(8, 8) for _ in range(3)]
    for layer in layers:
        assert wrapped(layer, reshard_after_forward=False) is layer  # the job's own result
    assert len(seen) == 3
    session.record_optimizer_start()  # a step: the process records from now on
    session.record_optimizer_end(0)
    probe.record()
    directory = session.directory
    session.close()
    meta = read_meta(directory)
    [row] = sharding_rows({"node": 0, "rank": 0, "pid": 1}, meta)
    assert row["api"] == "fully_shard" and row["units"] == 3
    assert row["reshard_after_forward"] == "False"
    assert row["unit_bytes"] == 3 * (8 * 8 + 8) * 4
    par = parallelism(pd.DataFrame(), {}, 2, False, pd.DataFrame([row]))
    assert par.describe() == "FSDP2 over 2 ranks; 3 units"


def test_a_zero_redundancy_optimizer_is_noted_with_its_settings(tmp_path: Path) -> None:
    session = Session(tmp_path, clock=FakeClock(), window_start=10**9)
    probe = ShardingProbe(session)

    class Zero:
        def __init__(self, params: Any, optimizer_class: type, **kwargs: Any) -> None:
            self.params = list(params)

    Zero.__init__ = probe._zero_init(Zero.__init__)  # type: ignore[method-assign]
    import torch

    zero = Zero(nn.Linear(4, 4).parameters(), optimizer_class=torch.optim.Adam,
                parameters_as_bucket_view=True, lr=0.1)
    assert len(zero.params) == 2  # the job's own object, as built
    session.record_optimizer_start()
    session.record_optimizer_end(0)
    probe.record()
    directory = session.directory
    session.close()
    [row] = sharding_rows({"node": 0, "rank": 0, "pid": 1}, read_meta(directory))
    assert row["api"] == "ZeroRedundancyOptimizer" and row["units"] == 1
    par = parallelism(pd.DataFrame(), {}, 2, True, pd.DataFrame([row]))
    assert par.describe() == ("DDP over 2 ranks; ZeRO-1 sharded optimizer over 2 ranks "
                              "(ZeroRedundancyOptimizer: Adam state sharded, "
                              "parameters_as_bucket_view=True, overlap_with_ddp=False)")
    assert par.kinds == ("ddp", "zero")
