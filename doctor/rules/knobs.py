"""What a fix changes, in words no framework owns (its knobs): ``num_workers``, ``precision``
("bf16", "fp16"), ``accumulation``, ``compile``... doctor.rules.frameworks spells each knob in the
job's framework's own words.

A fix's ``apply`` names its settings (the DataLoader's, the optimizer's, TF32, DDP's buckets).
A fix that needs code says its knobs in the snippet the rules write for it, and CODE_KNOBS reads
them back there: the autocast of doctor.analyse.precision.autocast_code (and the other
autocast snippets), doctor.rules.sound.PLAIN_COMPILE and its ``mode=`` form, the gradient
accumulation of doctor.rules.memory_fit, activation checkpointing, and a GradScaler's starting
scale and growth interval (doctor.rules.iterations). The tests hold each of those snippets to
its knobs, so that a snippet changed in a rule cannot leave its framework's words behind.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from doctor.verdict import Fix

#: (section, setting) of a fix's apply -> its knob
APPLY_KNOBS = {("dataloader", "num_workers"): "num_workers",
               ("dataloader", "pin_memory"): "pin_memory",
               ("dataloader", "persistent_workers"): "persistent_workers",
               ("dataloader", "prefetch_factor"): "prefetch_factor",
               ("optimizer", "fused"): "fused", ("optimizer", "foreach"): "foreach",
               ("ddp", "bucket_cap_mb"): "bucket_cap_mb",
               ("ddp", "gradient_as_bucket_view"): "gradient_as_bucket_view"}

Reader = Callable[[re.Match[str]], dict[str, Any]]

#: a pattern of a fix's code (or, where said so, its title) -> the knobs it sets
CODE_KNOBS: tuple[tuple[str, re.Pattern[str], Reader], ...] = (
    ("code", re.compile(r"torch\.autocast\([^)]*dtype=torch\.(bfloat16|float16)"),
     lambda m: {"precision": "bf16" if m[1] == "bfloat16" else "fp16"}),
    ("code", re.compile(r"torch\.compile\(model(?:, mode=\"([\w-]+)\")?\)"),
     lambda m: {"compile": True, **({"compile_mode": m[1]} if m[1] else {})}),
    ("title", re.compile(r"batch_size (\d+) -> (\d+), with (\d+) gradient accumulation"),
     lambda m: {"micro_batch": int(m[2]), "accumulation": int(m[3])}),
    ("code", re.compile(r"checkpoint_sequential\(|torch\.utils\.checkpoint\b"),
     lambda m: {"checkpointing": True}),
    ("code", re.compile(r"GradScaler\([^)]*init_scale=2\.0\*\*(-?\d+)(?:, growth_interval=(\d+))?"),
     lambda m: {"scale_power": int(m[1]),
                **({"growth_interval": int(m[2])} if m[2] else {})}),
)


def fix_knobs(fix: Fix) -> dict[str, Any]:
    """The knobs ``fix`` sets, from its apply and its code."""
    knobs: dict[str, Any] = {}
    for section, values in (fix.apply or {}).items():
        for name, value in values.items():
            knob = APPLY_KNOBS.get((section, name))
            if knob is not None:
                knobs[knob] = value
            elif (section, name) == ("torch", "matmul_precision") and value == "high":
                knobs["tf32"] = True
    for where, pattern, read in CODE_KNOBS:
        found = pattern.search(fix.title if where == "title" else fix.code)
        if found:
            knobs.update(read(found))
    return knobs
