"""The sharding probe (doctor.probes.sharding) around a stand-in for FSDP2's fully_shard, in a
real Session on a fake clock: each call counted with its settings, in meta.json, then in the
run's ``sharding`` frame and the job's parallelism."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest
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
    row = recorded(session, probe)
    assert row["api"] == "ZeroRedundancyOptimizer" and row["units"] == 1
    par = parallelism(pd.DataFrame(), {}, 2, True, pd.DataFrame([row]))
    assert par.describe() == ("DDP over 2 ranks; ZeRO-1 sharded optimizer over 2 ranks "
                              "(ZeroRedundancyOptimizer: Adam state sharded, "
                              "parameters_as_bucket_view=True, overlap_with_ddp=False)")
    assert par.kinds == ("ddp", "zero")


def recorded(session: Session, probe: ShardingProbe) -> dict[str, Any]:
    """After a step (the process records from then on), the probe's one row in meta.json."""
    session.record_optimizer_start()
    session.record_optimizer_end(0)
    probe.record()
    directory = session.directory
    session.close()
    [row] = sharding_rows({"node": 0, "rank": 0, "pid": 1}, read_meta(directory))
    return row


class _ZeroConfig:
    def __init__(self, stage: int) -> None:
        self.overlap_comm = stage == 3
        self.contiguous_gradients = True
        self.reduce_scatter = True
        self.reduce_bucket_size = 500_000_000
        self.allgather_bucket_size = 500_000_000
        self.offload_optimizer = type("Offload", (), {"device": "cpu"})()
        self.offload_param = None
        self.prefetch_bucket_size = 50_000_000
        self.max_live_parameters = 1_000_000_000
        self.param_persistence_threshold = 100_000


class _Engine:
    """A stand-in for DeepSpeed's engine: the methods and attributes the probe reads."""

    def __init__(self, model: nn.Module, stage: int) -> None:
        self.module = model
        self._config = type("Config", (), {"zero_config": _ZeroConfig(stage)})()
        self._stage = stage
        self.dp_world_size = 2
        self.communication_data_type = "torch.float32"
        self.optimizer = type("Opt", (), {"persistent_parameters": [model.bias]})()

    def zero_optimization_stage(self) -> int:
        return self._stage

    def gradient_accumulation_steps(self) -> int:
        return 1

    def fp16_enabled(self) -> bool:
        return False

    def bfloat16_enabled(self) -> bool:
        raise RuntimeError("a release without it")  # read defensively: left out


def test_a_deepspeed_engine_is_noted_with_its_zero_config(tmp_path: Path) -> None:
    session = Session(tmp_path, clock=FakeClock(), window_start=10**9)
    probe = ShardingProbe(session)
    _Engine.__init__ = probe._deepspeed_init(_Engine.__init__)  # type: ignore[method-assign]
    model = nn.Linear(4, 4)
    engine = _Engine(model, 3)
    assert engine.module is model  # the job's own object, as built
    _Engine(nn.Linear(2, 2), 1)  # a second engine is counted, the first one's config kept
    row = recorded(session, probe)
    assert row["api"] == "DeepSpeedEngine" and row["units"] == 2
    config = row["config"]
    assert config["stage"] == 3 and config["overlap_comm"] is True
    assert config["stage3_param_persistence_threshold"] == 100_000
    assert config["offload_optimizer"] == "cpu" and "offload_param" not in config
    assert config["communication_data_type"] == "float32" and "bf16" not in config
    assert config["parameter_bytes"] == (16 + 4) * 4
    assert config["persistent_params"] == 1 and config["persistent_bytes"] == 16
    par = parallelism(pd.DataFrame(), {}, 2, False, pd.DataFrame([row]))
    assert par.describe().startswith("DeepSpeed ZeRO-3 over 2 ranks (overlap_comm=True, ")
    assert "offload_optimizer=cpu" in par.describe() and par.kinds == ("sharded",)


def test_an_engine_that_fails_to_build_fails_as_it_would_and_is_not_counted(
        tmp_path: Path) -> None:
    session = Session(tmp_path, clock=FakeClock(), window_start=10**9)
    probe = ShardingProbe(session)

    class Broken:
        def __init__(self) -> None:
            raise ValueError("bad ds_config")

    Broken.__init__ = probe._deepspeed_init(Broken.__init__)  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="bad ds_config"):
        Broken()
    assert probe.deepspeed["units"] == 0

    class Bare:  # an engine with none of the attributes read: counted, nothing else
        pass

    Bare.__init__ = probe._deepspeed_init(lambda self: None)  # type: ignore[method-assign]
    Bare()
    assert probe.deepspeed == {"units": 1, "config": {}}
    session.close()


def test_parallelize_module_is_noted_once_per_plan_entry(tmp_path: Path) -> None:
    """A plan's entries are parallelised by calls of parallelize_module itself (through the
    module's global, wrapped too): each counted once, with its style and the mesh's size."""
    session = Session(tmp_path, clock=FakeClock(), window_start=10**9)
    probe = ShardingProbe(session)

    class ColwiseParallel:
        pass

    class RowwiseParallel:
        pass

    class Mesh:
        def size(self) -> int:
            return 2

    def parallelize_module(module: Any, device_mesh: Any = None,
                           parallelize_plan: Any = None) -> Any:
        if isinstance(parallelize_plan, dict):
            for style in parallelize_plan.values():
                wrapped(module, device_mesh, style)  # torch's own recursion, through the global
        return module

    wrapped = probe._parallelize(parallelize_module)
    model = nn.Linear(2, 2)
    plan = {"0": ColwiseParallel(), "2": RowwiseParallel(), "3": ColwiseParallel()}
    assert wrapped(model, Mesh(), plan) is model
    row = recorded(session, probe)
    assert (row["api"], row["units"], row["mesh_size"]) == ("parallelize_module", 3, 2)
    assert row["settings"] == "ColwiseParallel 2, RowwiseParallel 1"
    par = parallelism(pd.DataFrame(), {}, 2, False, pd.DataFrame([row]))
    assert par.describe() == "tensor parallel over 2 ranks (ColwiseParallel 2, RowwiseParallel 1)"
    assert par.kinds == ("tensor",) and par.sharded == ""
