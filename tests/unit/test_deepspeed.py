"""DeepSpeed ZeRO on frames: the engine's config (doctor.probes.deepspeed_config, as the sharding
probe records it) names the job's parallelism, gives ZeRO's collectives their role (stage 3's
small parameter gathers are no batch statistics, its reductions no DDP's), and comm.exposed
gives DeepSpeed's own config keys, skipping those the job has set, never DDP's, FSDP's or a
BatchNorm fix."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from doctor.analyse.comms import classify, waiting_times
from doctor.analyse.parallelism import GRADIENTS, SHARDED, STATS, parallelism, roles
from doctor.rules import communication, run_rules
from doctor.verdict import Finding
from tests.collective_frames import calls, rank_comms
from tests.support import evidence, steps

ZERO3 = {"stage": 3, "overlap_comm": True, "contiguous_gradients": True,
         "reduce_bucket_size": 500_000_000, "allgather_bucket_size": 500_000_000,
         "stage3_prefetch_bucket_size": 50_000_000, "stage3_max_live_parameters": 1_000_000_000,
         "stage3_param_persistence_threshold": 100_000, "gradient_accumulation_steps": 1,
         "fp16": False, "bf16": False, "communication_data_type": "float32", "world": 2,
         "parameter_bytes": 6_324_264, "persistent_params": 8, "persistent_bytes": 32_808}
ZERO1 = {**{k: v for k, v in ZERO3.items() if not k.startswith(("stage3", "persistent"))},
         "stage": 1, "overlap_comm": False}
#: ZeRO-3 a step: its 8 small parameters kept whole, gathered one call each after the step
#: (the next step's forward, as the window sees it), the large ones in one coalesced gather,
#: the gradients reduce-scattered in one bucket, and a scalar all-reduce (the gradients' norm).
STAGE3 = [*[("allgather", "forward", 2048, 1e-3)] * 8, ("allgather", "forward", 6.29e6, 10e-3),
          ("reducescatter", "backward", 6.32e6, 10e-3), ("allreduce", "backward", 4, 1e-3)]
#: ZeRO-1 a step: the gradients all-reduced, the updated parameters all-gathered.
STAGE1 = [("allreduce", "backward", 6.32e6, 20e-3), ("allgather", "forward", 6.32e6, 10e-3)]


def engine(config: dict[str, Any]) -> pd.DataFrame:
    """The sharding probe's row of a DeepSpeed engine (doctor.store.meta_rows.sharding_rows)."""
    return pd.DataFrame([{"node": 0, "rank": 0, "pid": 1, "api": "DeepSpeedEngine", "units": 1,
                          "reshard_after_forward": None, "mesh_size": 0, "unit_bytes": None,
                          "sharding_strategy": None, "forward_prefetch": None,
                          "backward_prefetch": None, "settings": None, "config": config}])


def zero_calls(rows: list[tuple[str, str, float, float]], **extra: Any) -> pd.DataFrame:
    frame = calls(rows, **extra)
    frame = classify(frame.drop(columns=["bound", "waiting_s"]), waiting_times(frame))
    frame["role"] = roles(frame, deepspeed=True)
    return frame


def finding(frame: pd.DataFrame, config: dict[str, Any]) -> Finding:
    comms = rank_comms(frame)
    par = parallelism(pd.concat([c.calls for c in comms.values()]),
                      {r: c.steps for r, c in comms.items()}, 2, False, engine(config))
    window = steps(device="cpu", gpu_busy_s=0.0, comm_s=0.08, comm_exposed_s=0.08)
    [f] = run_rules(evidence(window=window, comms=comms, cores=8, ranks_here=2,
                             parallelism=par), [communication.exposed_communication]).findings
    return f


def text(f: Finding) -> str:
    return "\n".join(x.title + x.why + x.code for x in f.fixes)


def fix(f: Finding, words: str) -> Any:
    return next(x for x in f.fixes if words in x.title)


def test_zero3s_small_gathers_are_parameters_and_its_reductions_not_ddps() -> None:
    # by their pattern alone, the small gathers in forward read as batch statistics ...
    plain = calls(STAGE3)
    assert set(plain[plain["bytes"] == 2048]["role"]) == {STATS}
    assert set(plain[plain["kind"] == "allreduce"]["role"]) == {GRADIENTS}
    # ... with the engine seen they are ZeRO's parameter gathers, and the all-reduce ZeRO's
    assert set(zero_calls(STAGE3)["role"]) == {SHARDED}
    assert set(zero_calls(STAGE1)["role"]) == {SHARDED}


def test_the_job_section_names_deepspeed_zero_from_its_config() -> None:
    frame = zero_calls(STAGE3)
    par = parallelism(frame, {0: 1, 1: 1}, 2, False, engine(ZERO3))
    assert par.sharded == "DeepSpeed ZeRO-3" and not par.ddp and par.stats_calls == 0
    assert par.kinds == ("sharded",)
    assert par.describe() == (
        "DeepSpeed ZeRO-3 over 2 ranks (overlap_comm=True, reduce_bucket_size=5e+08, "
        "stage3_prefetch_bucket_size=5e+07, stage3_max_live_parameters=1e+09, "
        "stage3_param_persistence_threshold=1e+05, gradient_accumulation_steps=1, "
        "communication_data_type=float32)")
    one = parallelism(zero_calls(STAGE1), {0: 1, 1: 1}, 2, False, engine(ZERO1))
    assert one.describe().startswith("DeepSpeed ZeRO-1 over 2 ranks (overlap_comm=False, "
                                     "reduce_bucket_size=5e+08, allgather_bucket_size=5e+08")
    assert "stage3" not in one.describe()
    # DDP only where its probe saw it; an engine whose config could not be read is still named
    assert "ddp" in parallelism(frame, {0: 1}, 2, True, engine(ZERO3)).kinds
    assert parallelism(frame, {0: 1}, 2, False, engine({})).sharded == "DeepSpeed"


def test_zero3_gets_deepspeeds_config_keys_never_ddp_fsdp_or_batchnorm() -> None:
    f = finding(zero_calls(STAGE3), ZERO3)
    words = text(f)
    for foreign in ("bucket_cap", "no_sync", "compress_hook", "fully_shard", "set_modules_to",
                    "BatchNorm", "GroupNorm", "FullyShardedDataParallel"):
        assert foreign not in words
    assert "DeepSpeed ZeRO's parameter all-gathers" in f.title
    assert f.evidence["exposed_by_role"] == {SHARDED: 1.0}
    down = fix(f, "ZeRO stage 3 -> 2")
    assert '"zero_optimization": {\n        "stage": 2' in down.code
    assert down.apply == {"deepspeed": {"zero_optimization.stage": 2}}  # doctor try's
    assert "3.0 MiB more a rank" in down.why  # half the parameters' 6.3 MB
    kept = fix(f, "stage3_param_persistence_threshold: 0")
    assert "8 small all-gathers a step" in kept.why
    # the line through the calls: 1 ms a call, the rest bandwidth; stage 2 saves the 8 small
    # gathers' latency (8 ms of the 29 ms exposed a step; its one post-step gather moves the
    # same bytes as the gathers it replaces)
    assert down.estimated_speedup == pytest.approx(1 / (1 - 0.8 * 8 / 29), rel=0.05)
    assert kept.estimated_speedup is None  # the fetch and release it adds are not modelled
    bf16 = fix(f, "communication_data_type: bf16")
    assert bf16.apply == {"deepspeed": {"communication_data_type": "bf16"}}
    # the reduce-scatter's 10 ms less its 1 ms latency, halved
    assert bf16.estimated_speedup == pytest.approx(1 / (1 - 0.8 * 4.5 / 29), rel=0.05)
    assert not any("overlap_comm" in x.title for x in f.fixes)  # on by default at stage 3
    assert not any("gradient_accumulation_steps" in x.title for x in f.fixes)  # stage 3


def test_a_setting_the_job_has_is_not_offered() -> None:
    done = {**ZERO3, "stage3_param_persistence_threshold": 0, "communication_data_type": "bf16"}
    titles = [x.title for x in finding(zero_calls(STAGE3), done).fixes]
    assert not any("persistence" in t or "bf16" in t for t in titles)
    assert any("stage 3 -> 2" in t for t in titles)
    assert not any("bf16" in x.title
                   for x in finding(zero_calls(STAGE3), {**ZERO3, "bf16": True}).fixes)
    # on a GPU, overlap_comm off is offered, on is not
    gpu_off = finding(zero_calls(STAGE1, on_gpu=True), ZERO1)
    assert '"overlap_comm": true' in text(gpu_off)
    gpu_on = finding(zero_calls(STAGE1, on_gpu=True), {**ZERO1, "overlap_comm": True})
    assert "overlap_comm" not in text(gpu_on)
    # on the CPU, DeepSpeed's streams are the training thread's: no overlap to gain
    assert "overlap_comm" not in text(finding(zero_calls(STAGE1), ZERO1))


def test_zero1_gets_stage_0_bf16_and_accumulation() -> None:
    f = finding(zero_calls(STAGE1), ZERO1)
    down = fix(f, "ZeRO stage 1 -> 0")
    assert down.estimated_speedup == pytest.approx(1 / (1 - 0.8 * 10 / 30), rel=0.05)
    bf16 = fix(f, "bf16")
    assert bf16.estimated_speedup == pytest.approx(1 / (1 - 0.8 * 10 / 30), rel=0.05)
    accumulate = fix(f, "gradient_accumulation_steps")
    assert accumulate.estimated_speedup is None and '"gradient_accumulation_steps": 4' in \
        accumulate.code
    assert "bucket_cap" not in text(f) and "no_sync" not in text(f)


def test_many_small_reductions_get_one_bucket_unless_the_bucket_holds_them() -> None:
    rows = [*[("allreduce", "backward", 64 * 1024, 1e-3)] * 16,
            ("allgather", "forward", 1e6, 2e-3)]
    small = {**ZERO1, "reduce_bucket_size": 16 * 1024}
    bucket = fix(finding(zero_calls(rows), small), "reduce_bucket_size")
    assert '"reduce_bucket_size": 262144' in bucket.code  # a step's 1 MiB in fp32 elements
    assert bucket.estimated_speedup is not None and bucket.estimated_speedup > 1.02
    assert "reduce_bucket_size" not in text(finding(zero_calls(rows), ZERO1))
