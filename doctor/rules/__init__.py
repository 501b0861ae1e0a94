"""Rules: small pure functions over the evidence (doctor.analyse.evidence.Evidence), one module
per topic.

``default_rules()`` is every rule of these modules, in their order; the analysis runs exactly
those.
"""

from __future__ import annotations

from doctor.analyse.evidence import Evidence
from doctor.analyse.stages import JobFacts
from doctor.rules import (
    allocator,
    causes,
    communication,
    compiles,
    compute,
    distributed,
    gpu,
    gpu_counters,
    host,
    idle_gpus,
    input,
    input_outside,
    iterations,
    memory,
    memory_fit,
    memory_growth,
    ops,
    optimizer,
    other,
    phases,
    precision,
    trace,
)
from doctor.rules.base import Rule, RuleOutcome, RuleSkipped, rule, run_rules

MODULES = (compute, compiles, optimizer, ops, distributed, gpu, gpu_counters, idle_gpus,
           communication, memory, memory_fit, memory_growth, allocator, host, input, input_outside,
           iterations, precision, other, causes, phases, trace)

__all__ = ["Evidence", "JobFacts", "Rule", "RuleOutcome", "RuleSkipped", "default_rules", "rule",
           "run_rules"]


def default_rules() -> list[Rule]:
    return [obj for module in MODULES for obj in vars(module).values() if isinstance(obj, Rule)]
