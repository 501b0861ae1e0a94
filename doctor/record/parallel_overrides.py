"""Inside a job run by ``doctor try``: the settings of its parallel libraries, applied once the
job imports them (doctor.record.overrides calls each then): ``fsdp``, the keyword arguments of
every FSDP2 ``fully_shard`` call (the function replaced in each module that exports it, before
the job's own import binds it; the sharding probe's wrapper then wraps this one); ``fsdp1``, those
of every FSDP1 FullyShardedDataParallel (auto-wrapped units included; ``sharding_strategy`` and
``backward_prefetch`` named by their enum's members); ``pipeline``, those of every
torch.distributed.pipelining schedule (each class whose own constructor takes the setting: the
one the job builds goes first, its bases' constructors then pass the tried value on)."""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .overrides import Overrides

#: The modules that export FSDP2's fully_shard, by torch release (probes/sharding.py's too).
FULLY_SHARD_AT = ("torch.distributed.fsdp", "torch.distributed.fsdp._fully_shard",
                  "torch.distributed.fsdp._fully_shard._fully_shard",
                  "torch.distributed._composable.fsdp",
                  "torch.distributed._composable.fsdp.fully_shard")


def fully_shard_calls(overrides: Overrides, values: dict[str, Any]) -> None:
    orig = getattr(sys.modules["torch.distributed.fsdp"], "fully_shard", None)
    if not callable(orig):
        overrides.errors.append("fsdp: this torch has no FSDP2 fully_shard")
        return
    wrapped = _fully_shard(overrides, orig, values)
    for name in FULLY_SHARD_AT:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "fully_shard", None) is orig:
            overrides.patch(module, "fully_shard", wrapped)


def _fully_shard(overrides: Overrides, orig: Callable[..., Any], values: dict[str, Any]
                 ) -> Callable[..., Any]:
    params = inspect.signature(orig).parameters
    known = overrides.known_settings(params, values, "fsdp")

    @functools.wraps(orig)
    def fully_shard(module: Any, *args: Any, **kwargs: Any) -> Any:
        settings = []
        for key, value in known.items():
            settings.append((key, kwargs.get(key, params[key].default), value))
            kwargs[key] = value
        overrides.changed("fsdp", "fully_shard", settings)
        return orig(module, *args, **kwargs)

    return fully_shard


def fsdp1_units(overrides: Overrides, values: dict[str, Any]) -> None:
    from torch.distributed import fsdp

    enums = {"sharding_strategy": fsdp.ShardingStrategy,
             "backward_prefetch": fsdp.BackwardPrefetch}
    typed = {k: enums[k][v] if k in enums else v for k, v in values.items()}
    overrides.override_init(fsdp.FullyShardedDataParallel, "fsdp1", typed,
                            shown=lambda v: getattr(v, "name", v))


def pipeline_schedules(overrides: Overrides, values: dict[str, Any]) -> None:
    from torch.distributed.pipelining import schedules

    base = schedules._PipelineSchedule
    overrides.override_classes([c for c in vars(schedules).values() if isinstance(c, type)
                                and issubclass(c, base) and "__init__" in vars(c)],
                               "pipeline", values)
