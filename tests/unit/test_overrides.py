"""The settings of a try, applied inside the job's process: DataLoader and DDP arguments at
construction, torch settings kept against the job's own later calls, each change said once."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from doctor.record.overrides import Overrides
from doctor.record.session import Session

DATA = TensorDataset(torch.zeros(8, 2))


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    threads = torch.get_num_threads()
    s = Session(tmp_path / "run", rank=0)
    yield s
    s.close()
    torch.set_num_threads(threads)


def started(session: Session, apply: dict) -> tuple[Overrides, list[str]]:
    said: list[str] = []
    o = Overrides(apply, session, say=said.append)
    o.start()
    return o, said


def test_dataloader_arguments_are_overridden_where_it_is_built(session: Session) -> None:
    o, said = started(session, {"dataloader": {"num_workers": 2, "persistent_workers": True}})
    try:
        loader = DataLoader(DATA, 4, False, None, None, 0)  # num_workers given by position
        assert (loader.num_workers, loader.persistent_workers) == (2, True)
        assert loader.batch_size == 4  # the rest as the job gave it
        DataLoader(DATA, batch_size=2)
    finally:
        o.stop()
    assert DataLoader(DATA).num_workers == 0  # restored
    assert said == ["doctor try: DataLoader(num_workers 0 -> 2, persistent_workers False -> "
                    "True)"]  # said once for the two loaders
    assert o.seen["dataloader.num_workers"]["job"] == [0, 0]
    assert o.seen["dataloader.num_workers"]["applied"] == 2


def test_settings_torch_refuses_without_workers_are_left_off(session: Session) -> None:
    o, said = started(session, {"dataloader": {"num_workers": 0}})
    try:
        loader = DataLoader(DATA, num_workers=2, persistent_workers=True, prefetch_factor=4)
        assert (loader.num_workers, loader.persistent_workers, loader.prefetch_factor) == \
            (0, False, None)
    finally:
        o.stop()
    assert "persistent_workers needs workers" in said[0]


def test_iterable_dataset_in_workers_is_warned(session: Session) -> None:
    class Stream(IterableDataset):
        def __iter__(self) -> Iterator[int]:
            yield from range(3)

    o, said = started(session, {"dataloader": {"num_workers": 2}})
    try:
        DataLoader(Stream())
    finally:
        o.stop()
    assert "IterableDataset" in said[0]


def test_a_value_the_job_already_has_is_noted_as_such(session: Session) -> None:
    o, said = started(session, {"dataloader": {"num_workers": 2}})
    try:
        DataLoader(DATA, num_workers=2)
    finally:
        o.stop()
    assert said == ["doctor try: DataLoader(nothing to change)"]
    assert o.seen["dataloader.num_workers"]["job"] == [2]


def test_thread_count_is_kept_against_the_jobs_own_call(session: Session) -> None:
    o, said = started(session, {"torch": {"num_threads": 1}})
    try:
        assert torch.get_num_threads() == 1
        torch.set_num_threads(3)  # the job's own call, after doctor's
        assert torch.get_num_threads() == 1
        assert o.seen["torch.num_threads"]["asked"] == 3
        session.role = "worker0"  # torch's call in a DataLoader worker passes through
        torch.set_num_threads(2)
        assert torch.get_num_threads() == 2
    finally:
        o.stop()
        session.role = "main"
    assert any("kept at 1" in s for s in said)


@contextlib.contextmanager
def one_rank_group(tmp_path: Path, overrides: Overrides) -> Iterator[None]:
    """A gloo process group of this process alone, the overrides stopped after it."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0,
                            world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
        overrides.stop()


def test_ddp_arguments_are_overridden(session: Session, tmp_path: Path) -> None:
    from torch.nn.parallel import DistributedDataParallel

    o, said = started(session, {"ddp": {"bucket_cap_mb": 5, "gradient_as_bucket_view": True}})
    with one_rank_group(tmp_path, o):
        model = DistributedDataParallel(torch.nn.Linear(2, 2))
        assert model.bucket_bytes_cap == 5 * 2**20
        assert model.gradient_as_bucket_view
    assert said == ["doctor try: DistributedDataParallel(bucket_cap_mb None -> 5, "
                    "gradient_as_bucket_view False -> True)"]


def test_a_sharded_optimizer_is_built_with_its_bucket_view(session: Session,
                                                           tmp_path: Path) -> None:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    o, said = started(session, {"zero": {"parameters_as_bucket_view": True}})
    with one_rank_group(tmp_path, o):
        zero = ZeroRedundancyOptimizer(torch.nn.Linear(2, 2).parameters(),
                                       optimizer_class=torch.optim.SGD, lr=0.1)
        assert zero.parameters_as_bucket_view
    assert said == ["doctor try: ZeroRedundancyOptimizer(parameters_as_bucket_view False -> "
                    "True)"]


def test_a_setting_this_torch_lacks_is_noted_and_the_job_goes_on(session: Session) -> None:
    o, _ = started(session, {"dataloader": {"no_such_argument": 1, "num_workers": 1}})
    try:
        assert DataLoader(DATA).num_workers == 1
    finally:
        o.stop()
    assert o.errors == ["DataLoader of this torch has no no_such_argument"]


def test_the_optimizer_is_built_fused_subclasses_once(session: Session) -> None:
    """fused=True to every torch.optim class that takes it: AdamW (a subclass of Adam, whose
    __init__ it calls) is changed and noted once; foreach=True beside it is left to torch."""
    params = [torch.nn.Parameter(torch.zeros(3))]
    o, said = started(session, {"optimizer": {"fused": True}})
    try:
        adamw = torch.optim.AdamW(params, lr=0.1, foreach=True)
        sgd = torch.optim.SGD(params, lr=0.1)
    finally:
        o.stop()
    assert adamw.defaults["fused"] is True and not adamw.defaults["foreach"]
    assert sgd.defaults["fused"] is True
    assert torch.optim.Adam(params, lr=0.1).defaults["fused"] is None  # restored
    assert o.seen["optimizer.fused"]["job"] == [None, None]  # AdamW's once, SGD's
    assert "foreach left to torch beside fused" in said[0]


def test_compile_off_hands_back_the_model_and_function_unchanged(session: Session) -> None:
    model = torch.nn.Linear(2, 2)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    compile_before = torch.compile
    module_compile_before = getattr(torch.nn.Module, "compile", None)
    o, said = started(session, {"torch": {"compile": "off"}})
    try:
        assert torch.compile(model, mode="max-autotune") is model
        assert torch.compile(fn) is fn
        assert torch.compile(mode="reduce-overhead")(fn) is fn  # @torch.compile(mode=...)
        if hasattr(torch.nn.Module, "compile"):
            model.compile()  # nn.Module's own: compiles nothing
            assert model.forward.__func__ is torch.nn.Linear.forward  # type: ignore[attr-defined]
    finally:
        o.stop()
    assert torch.compile is compile_before  # restored: torch compiles again
    assert getattr(torch.nn.Module, "compile", None) is module_compile_before
    assert said == ["doctor try: torch.compile -> eager (compile=off): the model runs "
                    "uncompiled"]  # once
    assert o.seen["torch.compile"]["tried"] == "off"
    assert o.seen["torch.compile"]["applied"] == 3 + hasattr(torch.nn.Module, "compile")


def test_compile_on_changes_nothing(session: Session) -> None:
    compile_before = torch.compile
    o, said = started(session, {"torch": {"compile": "on"}})
    try:
        assert torch.compile is compile_before
        assert "torch.compile" not in o.seen and not said
    finally:
        o.stop()


def test_every_fully_shard_call_is_made_with_the_tried_reshard(session: Session,
                                                                tmp_path: Path) -> None:
    """FSDP2's fully_shard is a function: the one the job imports after the start is the
    wrapped one, in every module that exports it; the stop puts torch's back."""
    import torch.distributed.fsdp as fsdp_module

    orig = fsdp_module.fully_shard
    o, said = started(session, {"fsdp": {"reshard_after_forward": False}})
    with one_rank_group(tmp_path, o):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        assert fully_shard is not orig
        model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
        mesh = init_device_mesh("cpu", (1,))
        fully_shard(model[0], mesh=mesh)
        fully_shard(model, mesh=mesh, reshard_after_forward=True)
        for unit in (model[0], model):
            group = unit._get_fsdp_state()._fsdp_param_group  # type: ignore[operator]
            assert group.post_forward_mesh_info is None  # kept gathered after forward
    assert fsdp_module.fully_shard is orig
    assert said == ["doctor try: fully_shard(reshard_after_forward None -> False)",
                    "doctor try: fully_shard(reshard_after_forward True -> False)"]
    assert o.seen["fsdp.reshard_after_forward"] == {"tried": False, "job": [None, True],
                                                    "applied": 2}


def test_every_fsdp1_unit_is_built_with_the_tried_strategy_and_prefetch(
        session: Session, tmp_path: Path) -> None:
    """FSDP1's FullyShardedDataParallel, the root and the units its auto-wrap policy builds:
    each takes the tried settings, its enums given by name; noted and said by name."""
    import warnings

    from torch.distributed.fsdp import BackwardPrefetch, FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    orig = FullyShardedDataParallel.__init__
    o, said = started(session, {"fsdp1": {"sharding_strategy": "SHARD_GRAD_OP",
                                          "forward_prefetch": True,
                                          "backward_prefetch": "BACKWARD_POST"}})
    with one_rank_group(tmp_path, o), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = FullyShardedDataParallel(
            torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)),
            auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear}),
            device_id=torch.device("cpu"))
        units = [m for m in model.modules() if isinstance(m, FullyShardedDataParallel)]
        assert len(units) == 3
        assert all(u.forward_prefetch for u in units)
        assert all(u.backward_prefetch == BackwardPrefetch.BACKWARD_POST for u in units)
    # one rank: FSDP itself turns the strategy it was given into NO_SHARD, and says which
    assert any("instead of ShardingStrategy.SHARD_GRAD_OP" in str(w.message) for w in caught)
    assert FullyShardedDataParallel.__init__ is orig
    assert said == ["doctor try: FullyShardedDataParallel(sharding_strategy None -> "
                    "SHARD_GRAD_OP, forward_prefetch False -> True, backward_prefetch "
                    "BACKWARD_PRE -> BACKWARD_POST)"]
    seen = o.seen["fsdp1.sharding_strategy"]
    assert (seen["tried"], seen["job"][0], seen["applied"]) == ("SHARD_GRAD_OP", None, 3)


def test_every_pipeline_schedule_splits_the_batch_into_the_tried_micro_batches(
        session: Session, tmp_path: Path) -> None:
    """GPipe (its base's constructor) and 1F1B (its own, then its base's): built with the
    tried n_microbatches, said once each, and the step runs with them."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle

    orig = PipelineScheduleSingle.__init__
    o, said = started(session, {"pipeline": {"n_microbatches": 4}})
    with one_rank_group(tmp_path, o):
        for cls in (ScheduleGPipe, Schedule1F1B):
            module = torch.nn.Linear(2, 2)
            stage = PipelineStage(module, 0, 1, torch.device("cpu"))
            schedule = cls(stage, n_microbatches=2, loss_fn=torch.nn.functional.mse_loss)
            assert schedule._n_microbatches == 4
            losses: list[torch.Tensor] = []
            schedule.step(torch.randn(8, 2), target=torch.randn(8, 2), losses=losses)
            assert len(losses) == 4  # one a micro-batch
    assert PipelineScheduleSingle.__init__ is orig
    assert said == ["doctor try: pipeline schedule(n_microbatches 2 -> 4)"]
    assert o.seen["pipeline.n_microbatches"] == {"tried": 4, "job": [2, 2], "applied": 2}


def test_deepspeeds_config_is_tried_on_a_copy_of_the_jobs(session: Session, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The keys set by their path in the config deepspeed.initialize is given (a dict or a
    JSON file's path); the job's own dict is left as it was; a config given elsewhere is not
    changed, and said so."""
    import sys
    import types

    given: list[dict] = []

    def initialize(args: object = None, model: object = None, config: object = None,
                   config_params: object = None) -> str:
        given.append({"config": config, "config_params": config_params})
        return "engine"

    fake = types.ModuleType("deepspeed")
    fake.initialize = initialize  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "deepspeed", fake)
    o, said = started(session, {"deepspeed": {"zero_optimization.stage": 2,
                                              "communication_data_type": "bf16"}})
    job = {"train_batch_size": 8, "zero_optimization": {"stage": 3, "overlap_comm": True}}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(job))
    try:
        assert fake.initialize(model="m", config=job) == "engine"  # type: ignore[attr-defined]
        fake.initialize(None, "m", config_params=str(path))  # type: ignore[attr-defined]
        fake.initialize(model="m")  # type: ignore[attr-defined]
        odd = {"zero_optimization": 3}  # not a section: the job's config goes as it is
        fake.initialize(model="m", config=odd)  # type: ignore[attr-defined]
    finally:
        o.stop()
    tried = {"train_batch_size": 8, "communication_data_type": "bf16",
             "zero_optimization": {"stage": 2, "overlap_comm": True}}
    assert given[0] == {"config": tried, "config_params": None}
    assert given[1] == {"config": None, "config_params": tried}
    assert given[2] == {"config": None, "config_params": None}
    assert given[3] == {"config": {"zero_optimization": 3}, "config_params": None}
    assert job["zero_optimization"]["stage"] == 3  # the job's own dict
    assert fake.initialize is initialize  # type: ignore[attr-defined]
    assert said[0] == ("doctor try: deepspeed.initialize(zero_optimization.stage 3 -> 2, "
                       "communication_data_type None -> bf16)")
    assert o.seen["deepspeed.zero_optimization.stage"]["job"] == [3, 3]
    assert o.errors == ["deepspeed: the job's config is not passed to "
                        "deepspeed.initialize(config=...): not applied",
                        "deepspeed: ValueError: the config's zero_optimization is not a section"]
