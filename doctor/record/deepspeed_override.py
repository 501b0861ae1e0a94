"""Inside a job run by ``doctor try``: DeepSpeed's config keys being tried (the ``deepspeed``
section of a fix's apply: ``{"deepspeed": {"zero_optimization.stage": 2}}``), set in the
config the job passes to ``deepspeed.initialize`` (``config=`` or ``config_params=``, a dict or
the path of a JSON file), on a copy: the job's own dict is left as it was. A config given only
as ``args.deepspeed_config`` is not changed (DeepSpeed refuses one in both places): said as not
applied. Each key is a path into the config (``zero_optimization.stage``)."""

from __future__ import annotations

import copy
import functools
import inspect
import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .overrides import Overrides

CONFIG_ARGS = ("config", "config_params")  # where deepspeed.initialize takes the config


def wrapped_initialize(overrides: Overrides, orig: Callable[..., Any],
                       values: dict[str, Any]) -> Callable[..., Any]:
    """``deepspeed.initialize`` with ``values`` set in the config it is given."""
    signature = inspect.signature(orig)

    @functools.wraps(orig)
    def initialize(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:  # the job's own mistake: let DeepSpeed say it
            return orig(*args, **kwargs)
        where = next((k for k in CONFIG_ARGS if bound.arguments.get(k) is not None), None)
        if where is None:
            overrides.errors.append("deepspeed: the job's config is not passed to "
                                    "deepspeed.initialize(config=...): not applied")
            overrides.save()
            return orig(*args, **kwargs)
        try:
            config = tried_config(overrides, bound.arguments[where], values)
        except Exception as err:  # the job's own config, untouched: the try says so
            overrides.errors.append(f"deepspeed: {type(err).__name__}: {err}")
            overrides.save()
            return orig(*args, **kwargs)
        bound.arguments[where] = config
        return orig(*bound.args, **bound.kwargs)

    return initialize


def tried_config(overrides: Overrides, given: Any, values: dict[str, Any]) -> dict[str, Any]:
    """A copy of the job's config (a dict, or read from the path it names) with each of
    ``values`` set at its path, what the job had noted."""
    if isinstance(given, str | os.PathLike):
        with open(given, encoding="utf-8") as f:
            given = json.load(f)
    config = copy.deepcopy(dict(given))
    settings = []
    for path, value in values.items():
        node = config
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"the config's {part} is not a section")
        settings.append((path, node.get(leaf), value))
        node[leaf] = value
    overrides.changed("deepspeed", "deepspeed.initialize", settings)
    return config
