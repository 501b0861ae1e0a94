"""The order of the findings: the most severe first and, within a severity, the findings of
the verdict's own bottleneck before the others, each group by its estimated speedup.

The rules' order alone (severity, then estimate: doctor.rules.base) put a compute fix first on
an input-bound job whose GEMM estimate happened to be higher ("fp32 GEMMs ... 1.55x" over
"input.preprocess" on a job whose verdict was preprocess, 32 %): the verdict named one thing and
the first fix another. An input stage's bottleneck leads with the whole input pipeline's
findings (io, decode, preprocess, and input not split by stage): their fixes overlap.
"""

from __future__ import annotations

from collections.abc import Sequence

from doctor.categories import INPUT_PIPELINE
from doctor.verdict import Finding

SEVERITY = {"critical": 0, "warning": 1, "info": 2}
#: Findings that fix a bottleneck of another category than their own: a straggling rank (its
#: category is what made it slow: its input, its compute) is what the other ranks' all-reduce
#: waits, the communication the verdict names, are spent on.
ALSO_ADDRESSES = {"distributed.straggler": frozenset({"communication"})}


def bottleneck_first(findings: Sequence[Finding], bottleneck: str | None) -> list[Finding]:
    """``findings`` (in the rules' order) with the bottleneck's first within each severity."""
    if not bottleneck:
        return list(findings)
    group = set(INPUT_PIPELINE) if bottleneck in INPUT_PIPELINE else {bottleneck}
    return sorted(findings, key=lambda f: (SEVERITY.get(f.severity, len(SEVERITY)),
                                           f.category not in group
                                           and not group & ALSO_ADDRESSES.get(f.id, set())))


__all__ = ["bottleneck_first"]
