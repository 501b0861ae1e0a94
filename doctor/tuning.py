"""The settings ``doctor try`` can change without touching the job's code: a fix's ``apply``.

An apply record names settings by section, e.g.::

    {"dataloader": {"num_workers": 2, "persistent_workers": true}}
    {"env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}}
    {"torch": {"num_threads": 1}}   {"torch": {"allow_tf32": true, "cudnn_benchmark": true}}
    {"ddp": {"bucket_cap_mb": 50, "gradient_as_bucket_view": true}}
    {"optimizer": {"fused": true}}  {"optimizer": {"foreach": true}}
    {"zero": {"parameters_as_bucket_view": true}}   (torch's ZeroRedundancyOptimizer)
    {"fsdp": {"reshard_after_forward": false}}     (every FSDP2 fully_shard call)
    {"fsdp1": {"sharding_strategy": "SHARD_GRAD_OP"}}  (every FullyShardedDataParallel)
    {"pipeline": {"n_microbatches": 8}}            (every torch.distributed.pipelining schedule)
    {"deepspeed": {"zero_optimization.stage": 2}}  (the config given to deepspeed.initialize)
    {"torch": {"compile": "off"}}   (torch.compile returns the model or function unchanged)
    {"pin_memory": true}            (short for {"dataloader": {"pin_memory": true}})

The bootstrap applies ``dataloader``, ``ddp``, ``optimizer`` (to every torch.optim class
that takes the setting), ``zero``, ``fsdp1`` (FSDP1's enums by their names), ``pipeline`` and
``fsdp`` as keyword arguments at construction (or at each ``fully_shard`` call), ``torch``
right after ``import torch``, and ``doctor try`` sets ``env`` for the job. This module is the
vocabulary only: it checks, normalises, parses ``--set KEY=VALUE`` and describes; it imports
neither torch nor the analysis.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from .errors import UsageError

Apply = dict[str, dict[str, Any]]

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _int_at_least(low: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ValueError(f"takes a whole number, not {value!r}")
        n = int(value)
        if n < low:
            raise ValueError(f"takes a whole number >= {low}, not {n}")
        return n

    return check


def _flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"takes true or false, not {value!r}")


def _positive(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError(f"takes a number, not {value!r}")
    x = float(value)
    if not x > 0:
        raise ValueError(f"takes a number > 0, not {value!r}")
    return int(x) if x == int(x) else x


def _one_of(*choices: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        text = str(value)
        if text not in choices:
            raise ValueError(f"takes one of {', '.join(choices)}, not {value!r}")
        return text

    return check


def _member(*names: str) -> Callable[[Any], str]:
    """An enum's member by its name, as ``SHARD_GRAD_OP``, ``shard_grad_op`` or
    ``ShardingStrategy.SHARD_GRAD_OP``."""
    def check(value: Any) -> str:
        text = str(value).rpartition(".")[2].strip()
        found = [n for n in names if n.lower() == text.lower()]
        if not found:
            raise ValueError(f"takes one of {', '.join(names)}, not {value!r}")
        return found[0]

    return check


#: section -> setting -> its check (which also converts text from the command line)
SETTINGS: dict[str, dict[str, Callable[[Any], Any]]] = {
    "dataloader": {
        "num_workers": _int_at_least(0),
        "pin_memory": _flag,
        "persistent_workers": _flag,
        "prefetch_factor": _int_at_least(1),
    },
    "ddp": {
        "bucket_cap_mb": _positive,
        "gradient_as_bucket_view": _flag,
        "static_graph": _flag,
        "broadcast_buffers": _flag,
    },
    "optimizer": {
        "fused": _flag,
        "foreach": _flag,
    },
    "zero": {
        "parameters_as_bucket_view": _flag,
    },
    "fsdp": {
        "reshard_after_forward": _flag,
    },
    # FSDP1's FullyShardedDataParallel; its enums by their members' names
    "fsdp1": {
        "sharding_strategy": _member("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD",
                                     "_HYBRID_SHARD_ZERO2"),
        "forward_prefetch": _flag,
        "backward_prefetch": _member("BACKWARD_PRE", "BACKWARD_POST"),
        "limit_all_gathers": _flag,
    },
    # every torch.distributed.pipelining schedule (the batch the job gives its step is split
    # into this many)
    "pipeline": {
        "n_microbatches": _int_at_least(1),
    },
    # keys of DeepSpeed's config, by their path in it (gradient_accumulation_steps is not one:
    # it changes the work of a step)
    "deepspeed": {
        "zero_optimization.stage": _int_at_least(0),
        "zero_optimization.stage3_param_persistence_threshold": _int_at_least(0),
        "zero_optimization.stage3_max_live_parameters": _int_at_least(0),
        "zero_optimization.stage3_max_reuse_distance": _int_at_least(0),
        "zero_optimization.stage3_prefetch_bucket_size": _int_at_least(1),
        "zero_optimization.reduce_bucket_size": _int_at_least(1),
        "zero_optimization.allgather_bucket_size": _int_at_least(1),
        "zero_optimization.overlap_comm": _flag,
        "communication_data_type": _one_of("fp32", "fp16", "bf16"),
    },
    "torch": {
        "num_threads": _int_at_least(1),
        "num_interop_threads": _int_at_least(1),
        "allow_tf32": _flag,
        "cudnn_benchmark": _flag,
        "matmul_precision": _one_of("highest", "high", "medium"),
        "sharing_strategy": _one_of("file_descriptor", "file_system"),
        "compile": _one_of("on", "off"),
    },
}
SECTIONS = (*SETTINGS, "env")
#: Settings that change the work of a step, which a comparison of step times cannot judge.
REFUSED = {
    "batch_size": "it changes the work of each step, so step times would not compare; change it "
                  "in the job and compare two runs with doctor compare",
}
#: What the job is told each setting is, for the lines said on stderr.
WHERE = {"dataloader": "DataLoader", "ddp": "DistributedDataParallel", "optimizer": "optimizer",
         "zero": "ZeroRedundancyOptimizer", "fsdp": "fully_shard",
         "fsdp1": "FullyShardedDataParallel", "pipeline": "pipeline schedule",
         "deepspeed": "deepspeed.initialize", "torch": "torch"}


def normalize(apply: Mapping[str, Any]) -> Apply:
    """A checked apply record, every value converted; ValueError (one line) when it is not."""
    out: Apply = {}
    for section, values in apply.items():
        if section in SETTINGS["dataloader"] and not isinstance(values, Mapping):
            values, section = {section: values}, "dataloader"  # {"pin_memory": true}
        if section not in SECTIONS or not isinstance(values, Mapping):
            raise ValueError(f"unknown setting section {section!r} (known: "
                             f"{', '.join(SECTIONS)})")
        part = out.setdefault(section, {})
        for key, value in values.items():
            if section == "env":
                if not _ENV_NAME.match(str(key)):
                    raise ValueError(f"{key!r} is not an environment variable name")
                part[str(key)] = str(value)
                continue
            check = SETTINGS[section].get(str(key))
            if check is None:
                raise ValueError(f"{section} has no setting {key!r} (known: "
                                 f"{', '.join(SETTINGS[section])})")
            try:
                part[str(key)] = check(value)
            except (TypeError, ValueError) as err:
                raise ValueError(f"{section}.{key} {err}") from None
    return {k: v for k, v in out.items() if v}


def parse_set(text: str) -> tuple[str, str, list[Any]]:
    """``KEY=VALUE[,VALUE...]`` -> (section, key, values). KEY is a setting's name
    (``num_workers``), ``section.name`` (``ddp.bucket_cap_mb``), or an environment variable
    (``env.NAME``, or any upper-case NAME). UsageError when it is none of those."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key or not value.strip():
        raise UsageError(f"--set takes KEY=VALUE (e.g. num_workers=4), not {text!r}")
    if key in REFUSED:
        raise UsageError(f"--set {key}: doctor try does not change {key}: {REFUSED[key]}")
    section, name = _resolve(key)
    raw = [v.strip() for v in value.split(",")] if section != "env" else [value]
    values = []
    for v in raw:
        try:
            values.append(normalize({section: {name: v}})[section][name])
        except ValueError as err:
            raise UsageError(f"--set {key}: {err}") from None
    return section, name, values


def _resolve(key: str) -> tuple[str, str]:
    if "." in key:
        section, _, name = key.partition(".")
        if section in SECTIONS:
            return section, name
    if key.startswith("env."):
        return "env", key[4:]
    homes = [s for s, names in SETTINGS.items() if key in names]
    if len(homes) == 1:
        return homes[0], key
    if _ENV_NAME.match(key) and key.upper() == key:
        return "env", key
    known = sorted({n for names in SETTINGS.values() for n in names})
    raise UsageError(f"--set: unknown setting {key!r}; doctor try can set {', '.join(known)}, "
                     "and environment variables (env.NAME or an upper-case NAME)")


def merge(records: list[Apply]) -> Apply | None:
    """The records together, or None when two of them set one setting to different values."""
    out: Apply = {}
    for record in records:
        for section, values in record.items():
            part = out.setdefault(section, {})
            for key, value in values.items():
                if key in part and part[key] != value:
                    return None
                part[key] = value
    return out


def describe(apply: Mapping[str, Mapping[str, Any]]) -> str:
    """``num_workers=2, persistent_workers=True`` (section named only where needed)."""
    words = []
    for section, values in apply.items():
        for key, value in values.items():
            words.append(f"{key}={value}" if section in ("dataloader", "env")
                         else f"{section}.{key}={value}")
    return ", ".join(words) or "nothing"


def key_of(apply: Mapping[str, Mapping[str, Any]]) -> str:
    """One text per record, equal for equal records (to match a try to a fix)."""
    return json.dumps(normalize(apply), sort_keys=True)
