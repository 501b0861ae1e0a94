"""What kind of parallelism a job's collectives serve, each collective's role in it, and the
words the verdict's job section gives it ("FSDP2 over 2 ranks, reshard after forward; 6 units").

Each collective of the window (doctor.trace.comm_calls: its kind, bytes, the step's phase it
was issued in, and the sharding library whose hook issued it) gets a role:

- ``sharded``: a sharded data-parallel job's parameter all-gathers and gradient reduce-scatters:
  issued by FSDP's hooks (FSDP2 or FSDP), or, with no hook seen (a trace without host
  annotations), all-gathers and reduce-scatters of ``STATS_BYTES`` or more; where the job built a
  DeepSpeed engine (the sharding probe saw it), every all-gather, reduce-scatter and all-reduce
  of any size: ZeRO's parameter gathers (stage 3's small ones too: a bias is no batch statistic)
  and its gradient reductions, never DDP's;
- ``stats``: synchronised batch statistics (SyncBatchNorm, detectron2's NaiveSyncBatchNorm),
  recognised by their pattern, not by a class: small collectives (all-gather or all-reduce under
  ``STATS_BYTES``) issued in forward, and the all-reduces in backward of the same sizes (each
  one's gradient);
- ``pipeline``: point-to-point sends and receives (pipeline stages);
- ``zero``: a sharded optimizer's parameter broadcasts (ZeRO stage 1, torch's
  ZeroRedundancyOptimizer: each rank steps its share of the parameters and broadcasts them),
  recognised by their pattern: broadcasts issued in the optimizer's step, and the broadcasts of
  the same sizes elsewhere in the window (a step the window cut);
- ``tensor``: tensor parallel layers' collectives of activations (DTensor's ColwiseParallel /
  RowwiseParallel: an all-reduce of each row-parallel layer's output in forward and of each
  column-parallel layer's input gradient in backward; all-gathers and reduce-scatters with
  sequence parallelism): the functional collectives (``_c10d_functional::``, not c10d's own
  calls) that no FSDP hook issued, where the job called ``parallelize_module`` (the sharding
  probe saw it), never where the probe saw only other sharding (a compiled FSDP2's gathers are
  functional too), and with no probe where some are all-reduces in forward (a compiled graph's
  gradient all-reduces run in backward alone, FSDP's gathers are no all-reduces);
- ``gradients``: the all-reduces left (DDP's buckets, or a hand-written gradient all-reduce);
- ``other``: the rest (broadcasts, all-to-all, barriers).

Only the ``gradients`` all-reduces are DDP's (none in a DeepSpeed job): the communication model
(doctor.analyse.comm_model) is fitted to them alone, and DDP's fixes are for them alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

SHARDED, STATS, PIPELINE, GRADIENTS, OTHER = "sharded", "stats", "pipeline", "gradients", "other"
ZERO, TENSOR = "zero", "tensor"
ROLES = (SHARDED, STATS, PIPELINE, ZERO, TENSOR, GRADIENTS, OTHER)
#: Below this a forward collective carries statistics, not parameters (a BatchNorm layer's
#: mean and variance over a few thousand channels, gathered from every rank).
STATS_BYTES = 64 * 1024
#: The sharding probe's name of torch's ZeRO-1 optimizer (doctor.probes.sharding).
ZERO_API = "ZeroRedundancyOptimizer"
#: The sharding probe's name of DeepSpeed's engine (doctor.probes.sharding).
DEEPSPEED_API = "DeepSpeedEngine"
#: The sharding probe's name of DTensor's tensor parallel API (doctor.probes.sharding).
TP_API = "parallelize_module"
#: The kinds of collective a tensor parallel layer issues.
TP_KINDS = ("allreduce", "allgather", "reducescatter", "alltoall")
#: Forward collectives of statistics a step (per rank) that make the pattern.
MIN_STATS_CALLS = 2
#: The DeepSpeed settings the job section names (doctor.probes.deepspeed_config), by stage.
DEEPSPEED_WORDS = ("overlap_comm", "reduce_bucket_size", "allgather_bucket_size",
                   "stage3_prefetch_bucket_size", "stage3_max_live_parameters",
                   "stage3_param_persistence_threshold", "gradient_accumulation_steps",
                   "communication_data_type", "offload_optimizer", "offload_param")
STAGE3_ONLY = ("stage3_prefetch_bucket_size", "stage3_max_live_parameters",
               "stage3_param_persistence_threshold", "offload_param")


def deepspeed_config(probe: pd.DataFrame | None) -> dict[str, Any] | None:
    """The first DeepSpeed engine's config the sharding probe recorded (its ZeRO ``stage`` and
    communication settings), None where the job built none; {} where none could be read."""
    if probe is None or probe.empty or "api" not in probe:
        return None
    rows = probe[probe["api"] == DEEPSPEED_API]
    if rows.empty:
        return None
    configs = [c for c in rows.sort_values(["rank", "pid"]).get("config", pd.Series(dtype=object))
               if isinstance(c, dict)]
    return dict(configs[0]) if configs else {}


def tensor_parallel_seen(probe: pd.DataFrame | None) -> bool | None:
    """Whether the job called ``parallelize_module`` (the sharding probe's rows): True; False
    where the probe saw other sharding only; None where it saw none."""
    if probe is None or probe.empty or "api" not in probe:
        return None
    return bool((probe["api"] == TP_API).any())


def roles(calls: pd.DataFrame, deepspeed: bool = False, tensor_parallel: bool | None = None
          ) -> pd.Series:
    """The role of each collective (see the module docstring), index of ``calls``;
    ``deepspeed``: the job built a DeepSpeed engine; ``tensor_parallel``: it called
    ``parallelize_module`` (True), the probe saw other sharding only (False), or no probe
    said (None)."""
    if calls.empty:
        return pd.Series(dtype=object, index=calls.index)
    kind = calls["kind"].astype(str)
    if deepspeed:
        out = pd.Series(OTHER, index=calls.index, dtype=object)
        out[kind.isin(("allgather", "reducescatter", "allreduce"))] = SHARDED
        out[kind == "sendrecv"] = PIPELINE  # DeepSpeed's pipeline engine
        return out
    nbytes = calls["bytes"].astype(float)
    phase = calls["phase"].fillna("").astype(str) if "phase" in calls else \
        pd.Series("", index=calls.index)
    owned = calls["owner"].fillna("").astype(str) != "" if "owner" in calls else \
        pd.Series(False, index=calls.index)
    small = nbytes.notna() & (nbytes < STATS_BYTES)
    shard_kinds = kind.isin(("allgather", "reducescatter"))
    out = pd.Series(OTHER, index=calls.index, dtype=object)
    out[kind == "allreduce"] = GRADIENTS
    out[kind == "sendrecv"] = PIPELINE
    out[owned | (shard_kinds & nbytes.notna() & ~small)] = SHARDED
    functional = calls["functional"].fillna(False).astype(bool) if "functional" in calls \
        else pd.Series(False, index=calls.index)
    tensor = functional & ~owned & kind.isin(TP_KINDS)
    if tensor_parallel is False or (tensor_parallel is None and not (
            tensor & (phase == "forward") & (kind == "allreduce")).any()):
        tensor[:] = False  # another library's, compiled (FSDP's gathers, DDP's all-reduces)
    out[tensor] = TENSOR
    claimed = owned | tensor  # an FSDP hook's or tensor parallel's: never statistics
    stepped = (kind == "broadcast") & (phase == "optimizer")
    if stepped.any():
        out[(kind == "broadcast") & (stepped | nbytes.isin(set(nbytes[stepped].tolist())))] = ZERO
    forward = ~claimed & small & (phase == "forward") & kind.isin(("allgather", "allreduce"))
    if _per_rank_steps(calls, forward) >= MIN_STATS_CALLS:
        # each one's gradient: of the statistics (an all-reduce's), or of every rank's
        # gathered (an all-gather's output: the group times what one rank gave)
        groups = calls["group"][calls["group"] > 1].unique().tolist() if "group" in calls \
            else []
        sizes = set(nbytes[forward].tolist())
        sizes |= {s * g for s in sizes for g in groups}
        back = ~claimed & small & (phase == "backward") & (kind == "allreduce") & \
            nbytes.isin(sizes)
        out[forward | back] = STATS
    return out


def _per_rank_steps(calls: pd.DataFrame, mask: pd.Series) -> float:
    """The most calls of ``mask`` on any one rank (a window's steps repeat the same calls:
    over the window, a step's pattern shows at least once)."""
    if not mask.any():
        return 0.0
    ranks = calls.loc[mask, "rank"] if "rank" in calls else pd.Series(0, index=calls.index)[mask]
    return float(ranks.value_counts().max())


@dataclass(frozen=True)
class RoleCost:
    """One role's collectives on one rank, per step of its window."""

    role: str
    calls: float
    seconds: float
    exposed_s: float
    bytes: float  # nan: not known
    bus_gb_per_s: float  # median; nan: not known


def role_costs(calls: pd.DataFrame, steps: int) -> dict[str, RoleCost]:
    """Per role (a ``role`` column), its calls, time, exposed time and bytes a step, over
    ``steps`` window steps, and its median bus bandwidth."""
    out: dict[str, RoleCost] = {}
    if calls.empty or "role" not in calls or steps <= 0:
        return out
    for role, mine in calls.groupby("role", sort=False):
        out[str(role)] = RoleCost(
            str(role), len(mine) / steps, float(mine["seconds"].sum()) / steps,
            float(mine["exposed_s"].sum()) / steps,
            float(mine["bytes"].sum(min_count=1)) / steps,
            float(mine["bus_bytes_s"].median()) / 1e9 if mine["bus_bytes_s"].notna().any()
            else float("nan"))
    return out


@dataclass(frozen=True)
class Parallelism:
    """What the job's collectives (and the objects the job built) say of its parallelism."""

    world: int | None
    ddp: bool  # DistributedDataParallel seen, or gradient all-reduces
    sharded: str  # "FSDP2", "FSDP" (whose hooks issued them), "sharded" (by the collectives
    # alone), "" (none)
    units: int  # sharded units seen (0: not known)
    reshard_after_forward: bool | None  # units all-gathered again before backward
    stats_calls: float  # collectives of batch statistics a step (forward and backward)
    pipeline_calls: float  # sends and receives a step
    settings: str = ""  # the sharded modules' own settings, as the job set them (probe)
    schedule: str = ""  # the pipeline's schedule class, as the job built it (probe)
    stages: int = 0  # the pipeline's stages (0: not known)
    microbatches: int = 0  # the schedule's micro-batches a step (0: not known)
    zero_calls: float = 0.0  # a sharded optimizer's parameter broadcasts a step
    zero: str = ""  # the sharded optimizer's class and settings, as the job built it (probe)
    tensor_calls: float = 0.0  # tensor parallel layers' collectives a step
    tensor: str = ""  # the tensor parallel styles the job applied (probe): "ColwiseParallel 6"
    tensor_size: int = 0  # the tensor parallel mesh's size (probe; 0: not known)
    deepspeed: tuple[tuple[str, Any], ...] = ()  # a DeepSpeed engine's config (probe), sorted

    @property
    def deepspeed_config(self) -> dict[str, Any] | None:
        """The DeepSpeed engine's config (doctor.probes.deepspeed_config), None: no engine."""
        return dict(self.deepspeed) if self.sharded.startswith("DeepSpeed") else None

    @property
    def kinds(self) -> tuple[str, ...]:
        """Each kind found: ``sharded``, ``ddp``, ``stats``, ``pipeline``, ``zero``,
        ``tensor``."""
        return tuple(k for k, found in (("sharded", bool(self.sharded)), ("ddp", self.ddp),
                                        ("stats", self.stats_calls > 0),
                                        ("pipeline", self.pipeline_calls > 0
                                         or bool(self.schedule)),
                                        ("zero", self.zero_calls > 0 or bool(self.zero)),
                                        ("tensor", self.tensor_calls > 0 or bool(self.tensor)))
                     if found)

    def describe(self) -> str:
        """In words, for the job section ("" where no collective was seen)."""
        over = f" over {self.world} ranks" if self.world else ""
        parts = []
        if self.sharded:
            name = "sharded data parallel (all-gathers and reduce-scatters)" \
                if self.sharded == "sharded" else self.sharded
            words = name + over
            if self.reshard_after_forward is not None:
                words += ", reshard after forward" if self.reshard_after_forward else \
                    ", no reshard after forward"
            if self.units:
                words += f"; {self.units} unit{'s' if self.units != 1 else ''}"
            if self.settings:
                words += f" ({self.settings})"
            parts.append(words)
        if self.ddp:
            parts.append(f"DDP{over}")
        if self.stats_calls > 0:
            parts.append(f"synchronised batch statistics ({self.stats_calls:g} small "
                         "collectives a step)")
        if self.zero or self.zero_calls > 0:
            words = f"ZeRO-1 sharded optimizer{over}"
            if self.zero:
                words += f" ({self.zero})"
            if self.zero_calls > 0:
                words += f"; {self.zero_calls:g} parameter broadcasts a step"
            parts.append(words)
        if self.tensor or self.tensor_calls > 0:
            words = "tensor parallel" + (f" in groups of {self.tensor_size}" if self.tensor_size
                                         and self.tensor_size != self.world else over)
            if self.tensor:
                words += f" ({self.tensor})"
            if self.tensor_calls > 0:
                words += f"; {self.tensor_calls:g} collectives of activations a step"
            parts.append(words)
        if self.schedule:
            parts.append(f"pipeline: {self.stages or '?'} stages, {schedule_name(self.schedule)}, "
                         f"{self.microbatches or '?'} micro-batches")
        elif self.pipeline_calls > 0:
            parts.append(f"pipeline stages ({self.pipeline_calls:g} sends and receives a step)")
        return "; ".join(parts)


def schedule_name(cls: str) -> str:
    """A schedule's class in words: ``ScheduleGPipe`` -> ``GPipe``."""
    return cls.removeprefix("Schedule") or cls


def parallelism(calls: pd.DataFrame, steps: Mapping[int, int], world: int | None,
                ddp_seen: bool, probe: pd.DataFrame | None = None,
                schedules: pd.DataFrame | None = None) -> Parallelism:
    """The job's parallelism from every rank's collectives (with a ``role`` column) and each
    rank's window steps; ``ddp_seen``: the DDP probe saw a DistributedDataParallel; ``probe``:
    the FSDP modules the job built (doctor.probes.sharding: RunData.sharding), whose API, count
    and settings come first; ``schedules``: the pipeline schedules it built
    (doctor.probes.pipelining: RunData.pipeline)."""
    found = _from_collectives(calls, steps, world, ddp_seen)
    if schedules is not None and not schedules.empty:
        row = schedules.sort_values(["rank", "pid"]).iloc[0]  # the first built: training's
        found = replace(found, schedule=str(row["schedule"]), stages=int(row["stages"]),
                        microbatches=int(row["microbatches"]))
    engine = deepspeed_config(probe)
    if engine is not None:
        return _deepspeed(found, engine)
    if probe is not None and not probe.empty:
        tensor = probe[probe["api"] == TP_API]
        probe = probe[probe["api"] != TP_API]
        if len(tensor):
            row = tensor.sort_values("units").iloc[-1]
            found = replace(found, tensor=str(row["settings"]) if isinstance(row["settings"], str)
                            else TP_API, tensor_size=int(row["mesh_size"] or 0))
    if probe is not None and not probe.empty:
        zero = probe[probe["api"] == ZERO_API]
        probe = probe[probe["api"] != ZERO_API]
        if len(zero):
            found = replace(found, zero=f"{ZERO_API}: {zero['settings'].iloc[0]}"
                            if isinstance(zero["settings"].iloc[0], str) else ZERO_API)
    if probe is None or probe.empty:
        return found
    row = probe.sort_values("units").iloc[-1]  # the rank that built the most
    api = "FSDP2" if row["api"] == "fully_shard" else "FSDP"
    settings = [f"{k}={row[k]}" for k in ("sharding_strategy", "forward_prefetch",
                                          "backward_prefetch") if isinstance(row[k], str)]
    return replace(found, sharded=api, units=int(row["units"]), settings=", ".join(settings),
                   reshard_after_forward=found.reshard_after_forward if found.sharded else None)


def _from_collectives(calls: pd.DataFrame, steps: Mapping[int, int], world: int | None,
                      ddp_seen: bool) -> Parallelism:
    if calls.empty or "role" not in calls:
        return Parallelism(world, ddp_seen, "", 0, None, 0.0, 0.0)
    role = calls["role"]
    sharded = calls[role == SHARDED]
    owners = sharded["owner"].fillna("").astype(str) if "owner" in sharded else \
        pd.Series(dtype=object)
    owner = str(owners[owners != ""].mode().iloc[0]) if (owners != "").any() else \
        ("sharded" if len(sharded) else "")
    units = sharded["unit"].fillna("").astype(str) if "unit" in sharded else \
        pd.Series(dtype=object)
    gathers = sharded[sharded["kind"] == "allgather"]
    reshard = bool((gathers["phase"] == "backward").any()) if len(gathers) and \
        "phase" in gathers else None
    rank_steps = max(steps.values()) if steps else 0

    def per_step(mask: pd.Series) -> float:
        if not rank_steps or not mask.any():
            return 0.0
        per_rank = calls.loc[mask, "rank"].value_counts() if "rank" in calls else \
            pd.Series([int(mask.sum())])
        return float(np.round(per_rank.max() / rank_steps, 1))

    return Parallelism(
        world, ddp_seen or bool((role == GRADIENTS).any()), owner,
        # whether units are gathered again before backward: said of FSDP's own units only
        int(units[units != ""].nunique()), reshard if owner in ("FSDP2", "FSDP") else None,
        per_step(role == STATS), per_step(role == PIPELINE), zero_calls=per_step(role == ZERO),
        tensor_calls=per_step(role == TENSOR))


def _deepspeed(found: Parallelism, config: Mapping[str, Any]) -> Parallelism:
    """The job's parallelism where it built a DeepSpeed engine: ZeRO at its stage, with the
    settings that shape its collectives; its all-reduces are ZeRO's, not DDP's."""
    stage = config.get("stage")
    name = f"DeepSpeed ZeRO-{stage}" if isinstance(stage, int) else "DeepSpeed"
    world = found.world or (config.get("world") if isinstance(config.get("world"), int) else None)
    words = [f"{k}={_setting(config[k])}" for k in DEEPSPEED_WORDS if k in config
             and (stage == 3 or k not in STAGE3_ONLY)
             and (stage != 3 or k != "allgather_bucket_size")]
    return replace(found, world=world, sharded=name, units=0, reshard_after_forward=None,
                   settings=", ".join(words), stats_calls=0.0, zero_calls=0.0, zero="",
                   deepspeed=tuple(sorted(config.items())))


def _setting(value: Any) -> str:
    """A setting in words: a byte or element count as ``5e+08``, the rest as it is."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 10_000:
        return f"{value:.3g}"
    return str(value)
