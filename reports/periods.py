"""The periods of a run whose later profiler windows found another bottleneck, in one line (the
terminal summary and the report's header): ``Periods: steps 1-4000: compute, 71%; from step
4001: io, 38%``. The figures are the verdict's ``periods`` (doctor.analyse.periods); where every
period names the same bottleneck, nothing is said, and periods in a row that agree are one."""

from __future__ import annotations

from typing import Any

from doctor.verdict import Verdict


def period_line(verdict: Verdict) -> str | None:
    """The line, or None where the run had one period or its periods agree. Periods in a row
    that name the same bottleneck are said as one (its share over their analysed time)."""
    groups: list[list[dict[str, Any]]] = []
    for p in (p for p in verdict.periods if isinstance(p, dict)):
        if groups and groups[-1][-1].get("bottleneck") == p.get("bottleneck"):
            groups[-1].append(p)
        else:
            groups.append([p])
    if len(groups) < 2:
        return None
    parts = []
    for i, group in enumerate(groups):
        first, last = group[0].get("first_step"), group[-1].get("last_step")
        steps = f"from step {first}" if i == len(groups) - 1 else f"steps {first}-{last}"
        parts.append(f"{steps}: {group[0].get('bottleneck')}, {_share(_weighted(group))}")
    return "Periods (a later profiler window opened where the run slowed down): " + \
        "; ".join(parts)


def _weighted(group: list[dict[str, Any]]) -> float | None:
    """The bottleneck's share over the group's analysed time (each period's own where the
    time is not there)."""
    pairs = [(p.get("bottleneck_share"), p.get("analysed_s")) for p in group]
    numbers = [(float(s), float(t)) for s, t in pairs
               if isinstance(s, int | float) and isinstance(t, int | float)]
    total = sum(t for _s, t in numbers)
    if len(numbers) == len(pairs) and total > 0:
        return sum(s * t for s, t in numbers) / total
    share = group[-1].get("bottleneck_share")
    return float(share) if isinstance(share, int | float) else None


def _share(value: Any) -> str:
    from doctor.reports.text import format_share

    return format_share(value)
