"""The rule framework: small pure functions over the evidence that return findings.

A rule declares the evidence it needs (names of fields of doctor.analyse.evidence.Evidence); the
engine skips it, recording why, when one of them is missing or empty. Rules never print and never
raise to the caller: a rule that fails is recorded as skipped with the error. ``@rule`` makes a
Rule of a function without registering it anywhere: the rules that run are the list given to
``run_rules`` (doctor.rules.default_rules() for the analysis), so a rule made in a test never
leaks into another test's run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from doctor.analyse.evidence import Evidence
from doctor.verdict import Finding

RuleFunc = Callable[[Evidence], list[Finding]]


@dataclass(frozen=True)
class Rule:
    id: str
    needs: tuple[str, ...]
    func: RuleFunc

    def __call__(self, evidence: Evidence) -> list[Finding]:
        return self.func(evidence)


class RuleSkipped(Exception):
    """Raised by a rule whose inputs are present but do not allow a conclusion."""


def rule(rule_id: str, needs: tuple[str, ...] = ()) -> Callable[[RuleFunc], Rule]:
    """Make a Rule of a function, needing the named Evidence fields."""

    def make(func: RuleFunc) -> Rule:
        return Rule(rule_id, needs, func)

    return make


@dataclass
class RuleOutcome:
    findings: list[Finding]
    skipped: dict[str, str]


def run_rules(evidence: Evidence, rules: Iterable[Rule]) -> RuleOutcome:
    """Run the rules whose needs are met; collect findings, and why each other was skipped."""
    findings: list[Finding] = []
    skipped: dict[str, str] = {}
    for r in rules:
        missing = evidence.missing(r.needs)
        if missing:
            skipped[r.id] = f"needs {', '.join(missing)}"
            continue
        try:
            findings.extend(r(evidence))
        except RuleSkipped as why:
            skipped[r.id] = str(why)
        except Exception as err:  # a broken rule must not cost the user their verdict
            skipped[r.id] = f"rule failed: {type(err).__name__}: {err}"
    order = {"critical": 0, "warning": 1, "info": 2}
    findings.sort(key=lambda f: (order[f.severity], -(f.estimated_speedup or 1.0)))
    return RuleOutcome(findings, skipped)
