"""What a DeepSpeed engine was built with, as far as its communication goes: read once from the
engine after its construction (doctor.probes.sharding wraps ``DeepSpeedEngine.__init__``), never
per step. Every read is defensive: a setting this DeepSpeed release does not have is left out,
and nothing here changes the engine.

The record (plain JSON values only): ``stage`` (ZeRO's), the ZeRO settings that shape the
collectives (``overlap_comm``, ``contiguous_gradients``, ``reduce_scatter``,
``reduce_bucket_size``, ``allgather_bucket_size`` and stage 3's ``stage3_prefetch_bucket_size``,
``stage3_max_live_parameters``, ``stage3_param_persistence_threshold``), the engine's
``gradient_accumulation_steps``, ``communication_data_type``, ``fp16``/``bf16`` enabled, where
the optimizer state and the parameters are offloaded (``offload_optimizer``/``offload_param``:
``cpu``, ``nvme``, absent: none), the data-parallel ``world``, the bytes of the model's
parameters (``parameter_bytes``, unsharded) and, at stage 3, its persistent parameters (kept
whole on every rank: ``persistent_params``, ``persistent_bytes``)."""

from __future__ import annotations

from typing import Any

#: The ZeRO config's field (DeepSpeedZeroConfig) -> the key a ds_config spells it with.
ZERO_FIELDS = {"overlap_comm": "overlap_comm", "contiguous_gradients": "contiguous_gradients",
               "reduce_scatter": "reduce_scatter", "reduce_bucket_size": "reduce_bucket_size",
               "allgather_bucket_size": "allgather_bucket_size",
               "prefetch_bucket_size": "stage3_prefetch_bucket_size",
               "max_live_parameters": "stage3_max_live_parameters",
               "param_persistence_threshold": "stage3_param_persistence_threshold"}


def engine_config(engine: Any) -> dict[str, Any]:
    """The engine's communication settings (the module docstring); {} where none can be read."""
    out: dict[str, Any] = {}
    stage = _call(engine, "zero_optimization_stage")
    if isinstance(stage, int):
        out["stage"] = stage
    zero = getattr(getattr(engine, "_config", None), "zero_config", None)
    for attr, key in ZERO_FIELDS.items():
        value = _plain(getattr(zero, attr, None))
        if value is not None:
            out[key] = value
    for name in ("offload_optimizer", "offload_param"):
        device = _plain(getattr(getattr(zero, name, None), "device", None))
        if isinstance(device, str) and device.split(".")[-1].lower() not in ("none", ""):
            out[name] = device.split(".")[-1].lower()
    steps = _call(engine, "gradient_accumulation_steps")
    if isinstance(steps, int):
        out["gradient_accumulation_steps"] = steps
    for key, method in (("fp16", "fp16_enabled"), ("bf16", "bfloat16_enabled")):
        enabled = _call(engine, method)
        if isinstance(enabled, bool):
            out[key] = enabled
    dtype = getattr(engine, "communication_data_type", None)
    if dtype is not None:
        out["communication_data_type"] = str(dtype).removeprefix("torch.")
    world = getattr(engine, "dp_world_size", None)
    if isinstance(world, int):
        out["world"] = world
    out.update(_parameter_bytes(engine))
    return out


def _call(engine: Any, method: str) -> Any:
    try:
        return getattr(engine, method)()
    except Exception:
        return None


def _plain(value: Any) -> Any:
    """A JSON value of a setting (an enum's value, a number, a bool), None for anything else."""
    value = getattr(value, "value", value)
    return value if isinstance(value, bool | int | float | str) else None


def _nbytes(param: Any) -> int:
    """A parameter's unsharded bytes (ZeRO-3 keeps its whole size in ``ds_numel``)."""
    numel = getattr(param, "ds_numel", None)
    return int(numel if isinstance(numel, int) else param.numel()) * int(param.element_size())


def _parameter_bytes(engine: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        out["parameter_bytes"] = sum(_nbytes(p) for p in engine.module.parameters())
    except Exception:
        pass
    try:
        persistent = list(getattr(engine.optimizer, "persistent_parameters", None) or ())
        if persistent:
            out["persistent_params"] = len(persistent)
            out["persistent_bytes"] = sum(_nbytes(p) for p in persistent)
    except Exception:
        pass
    return out
