"""The periods of a run whose later profiler windows found another bottleneck, in one line (the
terminal summary and the report's header): ``Periods: steps 1-4000: compute, 71%; from step
4001: io, 38%``. The figures are the verdict's ``periods`` (doctor.analyse.periods); where every
period names the same bottleneck, nothing is said."""

from __future__ import annotations

from typing import Any

from doctor.verdict import Verdict


def period_line(verdict: Verdict) -> str | None:
    """The line, or None where the run had one period or its periods agree."""
    periods = [p for p in verdict.periods if isinstance(p, dict)]
    if len({p.get("bottleneck") for p in periods}) < 2:
        return None
    parts = []
    for i, p in enumerate(periods):
        last = i == len(periods) - 1
        steps = (f"from step {p.get('first_step')}" if last
                 else f"steps {p.get('first_step')}-{p.get('last_step')}")
        parts.append(f"{steps}: {p.get('bottleneck')}, {_share(p.get('bottleneck_share'))}")
    return "Periods (a later profiler window opened where the run slowed down): " + \
        "; ".join(parts)


def _share(value: Any) -> str:
    from doctor.reports.text import format_share

    return format_share(value)
