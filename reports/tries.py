"""Reports of ``doctor try`` and ``doctor compare``: text for the terminal and one
self-contained HTML page (the words beside a verified fix are doctor.reports.verified's). They
format; the numbers were measured (doctor.tries) or compared (doctor.analyse.compare) already."""

from __future__ import annotations

import json

from doctor.analyse.compare import Comparison
from doctor.reports.text import CATEGORY_WORDS
from doctor.reports.verified import OUTCOME_WORDS, UNMEASURED, millis, times
from doctor.store.try_record import TryRecord


def try_rows(record: TryRecord) -> list[dict[str, str]]:
    rows = [{"id": "baseline", "setting": "the job as it is",
             "median": millis(record.baseline.get("median_step_s")), "measured": "",
             "spread": "", "estimated": "", "ratio": "", "outcome": ""}]
    for c in record.candidates:
        lo, hi = c.low, c.high
        outcome = c.outcome if c.outcome is not None else ""
        rows.append({
            "id": c.id, "setting": c.label, "median": millis(c.median_step_s),
            "measured": times(c.speedup),
            "spread": f"{lo:.2f}-{hi:.2f}" if lo and hi else "",
            "estimated": times(c.estimate) if c.estimate else "not estimated",
            "ratio": f"{c.ratio:.2f}" if c.ratio else "",
            "outcome": OUTCOME_WORDS.get(outcome, outcome),
        })
    return rows


def render_try_text(record: TryRecord, report: str | None = None) -> str:
    lines = [f"doctor try: {record.repeat} round(s), each job stopped after "
             f"{record.steps_per_attempt} steady steps (at step {record.stop_at_step})"]
    rows = try_rows(record)
    heads = {"id": "fix", "setting": "setting", "median": "median step", "measured": "measured",
             "spread": "repeats", "estimated": "estimated", "ratio": "ratio",
             "outcome": ""}
    widths = {k: max(len(heads[k]), *(len(r[k]) for r in rows)) for k in heads}
    lines.append("  " + "  ".join(heads[k].ljust(widths[k]) for k in heads).rstrip())
    for r in rows:
        lines.append("  " + "  ".join(r[k].ljust(widths[k]) for k in heads).rstrip())
    for c in record.candidates:
        if c.outcome in UNMEASURED:
            lines.append(f"  {c.label}: {c.why if c.why is not None else ''}")
        for err in c.errors or []:
            lines.append(f"  {c.label}: {err}")
        if c.stderr_tail:
            tail = c.stderr_tail.rstrip().splitlines()[-6:]
            lines += ["    | " + t for t in tail]
    if record.unsteady:
        lines.append(f"Unsure: {record.unsteady}")
    best = record.candidate(record.best) if record.best else None
    if best is not None:
        lines.append(f"Best: {best.label} ({times(best.speedup)})")
    manual = record.manual or []
    if manual:
        lines.append(f"Not tried (they need code): {', '.join(m['id'] for m in manual[:8])}"
                     + (" ..." if len(manual) > 8 else ""))
    for note in record.env_notes or []:
        lines.append(f"Environment: {note}")
    cost = record.cost or {}
    if cost.get("wall_s"):
        lines.append(f"It took {cost['wall_s']:.0f} s for {cost.get('attempts')} runs of the job.")
    if report:
        lines.append(f"Report: {report}")
    return "\n".join(lines) + "\n"


def render_try_html(record: TryRecord) -> str:
    from doctor.reports.html import environment  # jinja2: only for the HTML

    return environment().get_template("try.html.j2").render(
        kind="try", record=record, record_data=record.to_dict(), rows=try_rows(record))


def render_compare_json(comparison: Comparison) -> str:
    """What ``doctor compare --format json`` prints: the comparison's dict (Comparison.to_dict)."""
    return json.dumps(comparison.to_dict(), indent=2, default=str) + "\n"


def render_compare_text(comparison: Comparison) -> str:
    a, b = comparison.a, comparison.b
    lines = [f"A: {a.source}", f"B: {b.source}",
             f"  median step   A {millis(a.median_step_s)}   B {millis(b.median_step_s)}   "
             f"B is {times(comparison.speedup)} the speed of A",
             f"  bottleneck    A {a.bottleneck}   B {b.bottleneck}",
             "  shares        A       B       B-A"]
    for cat, row in comparison.shares.items():
        lines.append(f"    {cat:<13} {row.a:>5.0%}   {row.b:>5.0%}   {row.delta:>+5.0%}")
    for key, (va, vb) in comparison.settings.items():
        lines.append(f"  {key}: A {va}, B {vb}")
    return "\n".join(lines) + "\n"


def render_compare_html(comparison: Comparison) -> str:
    from doctor.reports.html import environment  # jinja2: only for the HTML

    return environment().get_template("try.html.j2").render(
        kind="compare", comparison=comparison, comparison_data=comparison.to_dict(),
        words=CATEGORY_WORDS, fmt={"ms": millis, "x": times})
