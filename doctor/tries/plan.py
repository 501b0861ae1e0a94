"""What ``doctor try`` runs: the candidates (settings to try against the job as it is).

A candidate comes from a fix of the run's findings that carries an ``apply`` record (fix id
``<finding id>:<n>``, n counting the finding's fixes from 1), or from ``--set KEY=VALUE``
(several values of a key sweep them; several keys go together). With neither, every applicable
fix is tried alone, then the compatible ones together. Fixes that need code are listed as such.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from doctor.errors import UsageError
from doctor.tuning import Apply, describe, key_of, merge, normalize, parse_set
from doctor.verdict import Finding, Fix, fix_id

MAX_CANDIDATES = 12
COMBINED = "combined"


@dataclass(frozen=True)
class Candidate:
    id: str  # "input.loader:1", "set:num_workers=4", "combined"
    apply: Apply
    estimate: float | None = None  # the estimated speedup it checks
    fixes: tuple[str, ...] = ()  # the fix ids it stands for
    title: str = ""

    @property
    def label(self) -> str:
        return describe(self.apply)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "label": self.label, "apply": self.apply,
                "estimate": self.estimate, "fixes": list(self.fixes), "title": self.title}


@dataclass(frozen=True)
class ManualFix:
    id: str
    title: str


@dataclass
class Plan:
    candidates: list[Candidate]
    manual: list[ManualFix] = field(default_factory=list)
    sweep: bool = False  # one key's values: name the best


def fix_ids(findings: Sequence[Finding]) -> list[tuple[str, Finding, Fix]]:
    return [(fix_id(finding.id, n), finding, fix)
            for finding in findings for n, fix in enumerate(finding.fixes, 1)]


def plan_try(findings: Sequence[Finding], wanted: Sequence[str] = (),
             sets: Sequence[str] = ()) -> Plan:
    """The candidates for ``--fix`` ids (a fix id, or a finding id for its applicable fixes)
    and ``--set`` texts; with neither, every applicable fix and then the compatible ones
    together. UsageError for an id that names nothing, or a fix that needs code."""
    every = fix_ids(findings)
    manual = [ManualFix(i, fix.title) for i, _, fix in every if fix.apply is None]
    tryable = [_from_fix(i, fx) for i, _, fx in every if fx.apply is not None]
    singles: list[Candidate] = []
    if wanted:
        for want in wanted:
            chosen = [(i, f, fx) for i, f, fx in every if i == want or f.id == want]
            if not chosen:
                known = ", ".join(sorted(c.id for c in tryable))
                raise UsageError(f"--fix {want}: this run has no such fix (those doctor try "
                                 f"can apply: {known or 'none'})")
            applicable = [c for c in chosen if c[2].apply is not None]
            if not applicable:
                raise UsageError(f"--fix {want}: {chosen[0][2].title!r} needs a change to the "
                                 "code, which doctor try does not make")
            singles += [_from_fix(i, fx) for i, _, fx in applicable]
    elif not sets:
        singles = tryable
    candidates = _unique(singles)
    sweep = False
    if sets:
        from_sets = _from_sets(sets, candidates + _unique(tryable))
        sweep = len(from_sets) > 1 and len({s.partition("=")[0] for s in sets}) == 1
        candidates = _unique(candidates + from_sets)
    elif not wanted and len(candidates) > 1:
        together = _combined(candidates)
        if together is not None:
            candidates.append(together)
    if len(candidates) > MAX_CANDIDATES:
        raise UsageError(f"{len(candidates)} settings to try; at most {MAX_CANDIDATES} in one "
                         "doctor try: name fewer with --fix or --set")
    return Plan(candidates, manual, sweep)


def _from_fix(fix_id: str, fix: Fix) -> Candidate:
    assert fix.apply is not None
    return Candidate(fix_id, normalize(fix.apply), fix.estimated_speedup, (fix_id,), fix.title)


def _unique(candidates: list[Candidate]) -> list[Candidate]:
    """One candidate per distinct setting (a fix that two findings give is tried once)."""
    out: dict[str, Candidate] = {}
    for c in candidates:
        key = key_of(c.apply)
        if key in out:
            first = out[key]
            out[key] = Candidate(first.id, first.apply,
                                 first.estimate if first.estimate is not None else c.estimate,
                                 first.fixes + tuple(f for f in c.fixes if f not in first.fixes),
                                 first.title)
        else:
            out[key] = c
    return list(out.values())


def _combined(candidates: list[Candidate]) -> Candidate | None:
    """The candidates that agree with each other (the first ones kept), all at once."""
    taken: list[Candidate] = []
    for c in candidates:
        if merge([*(t.apply for t in taken), c.apply]) is not None:
            taken.append(c)
    if len(taken) < 2:
        return None
    together = merge([t.apply for t in taken])
    assert together is not None
    return Candidate(COMBINED, together, None, tuple(f for t in taken for f in t.fixes),
                     "the compatible fixes together")


def _from_sets(sets: Sequence[str], fixes: list[Candidate]) -> list[Candidate]:
    """One candidate per combination of the --set values; one that equals a fix's setting
    checks that fix's estimate."""
    axes: dict[tuple[str, str], list[Any]] = {}
    for text in sets:
        section, key, values = parse_set(text)
        axes.setdefault((section, key), [])
        axes[(section, key)] += [v for v in values if v not in axes[(section, key)]]
    count = 1
    for values in axes.values():
        count *= len(values)
    if count > MAX_CANDIDATES:
        raise UsageError(f"--set makes {count} combinations; at most {MAX_CANDIDATES} in one "
                         "doctor try")
    by_key = {key_of(f.apply): f for f in fixes}
    out = []
    for combo in itertools.product(*axes.values()):
        apply: Apply = {}
        for (section, key), value in zip(axes, combo, strict=True):
            apply.setdefault(section, {})[key] = value
        match = by_key.get(key_of(apply))
        out.append(Candidate(f"set:{describe(apply)}", apply,
                             match.estimate if match else None,
                             match.fixes if match else (), match.title if match else ""))
    return out
