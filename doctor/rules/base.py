"""The rule framework: small pure functions over frames that return findings.

A rule declares the inputs it needs (names of entries in :class:`RuleInputs`); the engine skips
it, recording why, when one of them is missing or empty. Rules never print and never raise to the
caller: a rule that fails is recorded as skipped with the error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from doctor.verdict import Finding

RuleFunc = Callable[["RuleInputs"], list[Finding]]


@dataclass
class RuleInputs:
    """Everything a rule may read. Frames absent for this job are None.

    - ``ledger``: one row per (rank, step) of analysed steps, seconds per category
      (doctor.analyse.ledger).
    - ``host``: host samples from the parent (probes.host), one row per (tick, pid).
    - ``system``: machine-wide samples (cores, runnable threads, iowait), one row per tick.
    - ``gpu_steps``: per profiled step GPU-side figures from a Kineto trace (doctor.trace).
    - ``memory``: CUDA allocator snapshots (probes.memory).
    - ``loaders``: DataLoader settings seen, one row per loader.
    - ``meta``: facts about the job (cores, torch threads, device, world size, ...).
    """

    ledger: pd.DataFrame | None = None
    host: pd.DataFrame | None = None
    system: pd.DataFrame | None = None
    gpu_steps: pd.DataFrame | None = None
    memory: pd.DataFrame | None = None
    loaders: pd.DataFrame | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def missing(self, needs: Iterable[str]) -> list[str]:
        out = []
        for name in needs:
            value = getattr(self, name)
            if value is None or (isinstance(value, pd.DataFrame) and value.empty):
                out.append(name)
        return out


@dataclass(frozen=True)
class Rule:
    id: str
    needs: tuple[str, ...]
    func: RuleFunc


class RuleSkipped(Exception):
    """Raised by a rule whose inputs are present but do not allow a conclusion."""


_REGISTRY: dict[str, Rule] = {}


def rule(rule_id: str, needs: tuple[str, ...] = ()) -> Callable[[RuleFunc], RuleFunc]:
    """Register a rule function under ``rule_id``, needing the named RuleInputs entries."""

    def register(func: RuleFunc) -> RuleFunc:
        _REGISTRY[rule_id] = Rule(rule_id, needs, func)
        return func

    return register


def registered_rules() -> list[Rule]:
    return list(_REGISTRY.values())


@dataclass
class RuleOutcome:
    findings: list[Finding]
    skipped: dict[str, str]


def run_rules(inputs: RuleInputs, rules: Iterable[Rule] | None = None) -> RuleOutcome:
    """Run the rules whose needs are met; collect findings, and why each other was skipped."""
    findings: list[Finding] = []
    skipped: dict[str, str] = {}
    for r in registered_rules() if rules is None else rules:
        missing = inputs.missing(r.needs)
        if missing:
            skipped[r.id] = f"needs {', '.join(missing)}"
            continue
        try:
            findings.extend(r.func(inputs))
        except RuleSkipped as why:
            skipped[r.id] = str(why)
        except Exception as err:  # a broken rule must not cost the user their verdict
            skipped[r.id] = f"rule failed: {type(err).__name__}: {err}"
    order = {"critical": 0, "warning": 1, "info": 2}
    findings.sort(key=lambda f: (order[f.severity], -(f.estimated_speedup or 1.0)))
    return RuleOutcome(findings, skipped)
