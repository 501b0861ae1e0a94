"""The HTML report: one self-contained file, from a cached jinja2 environment.

Autoescape is on for everything, so every string that comes from the job (script name,
arguments, paths, probe reasons) is escaped by the template. The CSS is inlined, the charts are
inline SVG, the verdict is embedded as a JSON data block through ``|tojson``, and nothing is
fetched from the network: the file opens offline in any browser and prints cleanly.

This module prepares plain values for the template (formatting only; the analysis is done).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd
from markupsafe import Markup

from doctor.analyse.analysis import Analysis
from doctor.reports import charts, memory_charts, roofline_chart
from doctor.reports.json import verdict_data
from doctor.reports.periods import period_line
from doctor.reports.phases import phase_lines
from doctor.reports.slow_steps import slow_step_lines
from doctor.reports.tables import shown_table
from doctor.reports.text import (
    CATEGORY_WORDS,
    format_speedup,
    format_value,
    headline,
    job_items,
    partial_line,
    steps_line,
)
from doctor.reports.verified import verified_line
from doctor.verdict import SCHEMA, Finding, fix_id

#: Rows of a table shown in full; longer tables are cut and say how many rows were left out.
MAX_TABLE_ROWS = 200

#: Titles for the tables that analyses are known to attach; others get their name as title.
TABLE_TITLES: dict[str, str] = {
    "ranks": "Per rank: step time and shares",
    "loaders": "DataLoader settings",
    "top_functions": "Where the time goes, by function",
    "processes": "CPU per process",
    "gpus": "Per GPU: NVML over the analysed steps",
    "gpu_over_run": "Per GPU over the run, in tenths: utilisation and memory",
    "memory": "Per rank: where the memory goes",
    "ops": "Top ops of the lowest rank's window: time, class and share of the roof",
    "communication": "Per rank: collectives by kind (bytes, time, exposed, bus bandwidth, "
                     "waiting for other ranks, and what bounds them)",
    "sharded_phases": "Sharded collectives by phase and unit, a step (all-gathers before "
                      "forward and backward, reduce-scatters after; exposed and overlapped "
                      "time, bus bandwidth against the link, whether prefetch worked)",
    "comm_what_if": "What the communication model predicts: each change's exposed "
                    "communication and step (the measured step changed by that alone), and the "
                    "step at more ranks for the same global batch",
}
#: Tables drawn as charts only.
TABLES_AS_CHARTS = ("memory_over_run",)

@dataclass(frozen=True)
class TableView:
    """A frame ready for the template: formatted cells and which columns are numeric."""

    name: str
    title: str
    columns: list[str]
    numeric: list[bool]
    rows: list[list[str]]
    left_out: int


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The jinja2 environment for the report templates (cached: built once per process)."""
    loader = jinja2.PackageLoader("doctor.reports", "templates")
    env = jinja2.Environment(
        loader=loader,
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )

    def include_raw(name: str) -> Markup:
        """A file of ours from the templates folder, verbatim (the stylesheet)."""
        source, _, _ = loader.get_source(env, name)
        return Markup(source)

    env.globals["include_raw"] = include_raw
    env.policies["json.dumps_kwargs"] = {"sort_keys": True, "indent": None}
    return env


def render_html(analysis: Analysis, timeline: str | None = None) -> str:
    """The report for ``analysis`` as one self-contained HTML document; ``timeline``: where the
    run's timeline file is, relative to the report (or absolute), for a link to it."""
    template = environment().get_template("report.html.j2")
    return template.render(**_context(analysis), **_timeline_context(analysis, timeline))


def _timeline_context(analysis: Analysis, timeline: str | None) -> dict[str, Any]:
    from doctor.reports.timeline import HOW_TO_OPEN

    if not timeline:
        return {"timeline": None}
    return {"timeline": Path(timeline).as_uri() if Path(timeline).is_absolute() else timeline,
            "timeline_name": Path(timeline).name, "timeline_how": HOW_TO_OPEN,
            "timeline_kernels": analysis.verdict.job.get("device") == "cuda"}


def _context(analysis: Analysis) -> dict[str, Any]:
    verdict = analysis.verdict
    shares_svg = charts.shares_chart(verdict.shares, verdict.bottleneck)
    steps_svg = charts.step_time_chart(analysis.ledger, analysis.sections.whole_run)
    return {
        "schema": SCHEMA,
        "headline": headline(verdict),
        "bottleneck": verdict.bottleneck,
        "steps_line": steps_line(verdict),
        "period_line": period_line(verdict),
        "partial": verdict.partial,
        "partial_line": partial_line(verdict) if verdict.partial else "",
        "shares": _shares(verdict.shares, verdict.bottleneck),
        "shares_svg": Markup(shares_svg) if shares_svg else None,
        "steps_svg": Markup(steps_svg) if steps_svg else None,
        "multi_rank": analysis.rank_count() > 1,
        "has_warmup": analysis.has_warmup(),
        "marks": analysis.step_marks(),
        "decimated": charts.is_decimated(analysis.ledger),
        "findings": [_finding(f) for f in verdict.findings],
        "probes": [
            {"name": name, "ok": p.ok, "reason": p.reason, "hint": p.hint}
            for name, p in sorted(verdict.probes.items(), key=lambda kv: (kv[1].ok, kv[0]))
        ],
        "job": job_items(verdict.job),
        "notes": list(verdict.notes),
        "extra": [("bottleneck_share", format_value("bottleneck_share", verdict.bottleneck_share)),
                  ("rules_skipped", format_value("rules_skipped", verdict.rules_skipped))],
        "tables": [_table(name, frame) for name, frame in analysis.tables.present()
                   if name not in TABLES_AS_CHARTS],
        "memory": _memory(analysis),
        "slow_lines": slow_step_lines(analysis.sections),
        "phase_lines": phase_lines(analysis.sections),
        "ops": _ops(analysis),
        "source": analysis.source,
        "verdict_data": verdict_data(analysis),
    }


def _memory(analysis: Analysis) -> dict[str, Any] | None:
    """The memory section: its two charts and a caption of where the numbers come from."""
    table = analysis.tables.memory
    memory = analysis.sections.memory
    if table is None or memory is None or not memory.ranks:
        return None
    bar = memory_charts.breakdown_chart(table)
    over = memory_charts.over_run_chart(analysis.tables.memory_over_run)
    first = next(iter(memory.ranks.values()))
    sources = [f"activations: {first.activations_source}"] if first.activations_source else []
    if first.derived:
        sources.append(f"derived, not measured: {', '.join(first.derived)}")
    if first.peak_source:
        sources.append(f"peak: {first.peak_source}")
    if first.capacity_bytes:
        sources.append(f"capacity: {format_value('bytes', first.capacity_bytes)}, "
                       f"{first.capacity_source}"
                       + ("" if memory_charts.shows_capacity(table) else
                          " (not drawn: the peak is a small part of it)"))
    return {"bar_svg": Markup(bar) if bar else None, "over_svg": Markup(over) if over else None,
            "sources": sources}


def _ops(analysis: Analysis) -> dict[str, Any] | None:
    """The ops section: the roofline chart of the lowest rank, and what its roofs are."""
    first = analysis.sections.first_ops()
    if first is None:
        return None
    svg = roofline_chart.roofline_chart(analysis.tables.ops, first.roofs)
    words = []
    if first.roofs is not None:
        words.append(f"roofs: {first.roofs.source}")
        if cross_check := first.roofs.cross_check():
            words.append(cross_check)
    if first.mfu is not None:
        words.append(f"model FLOP utilisation {format_value('share', first.mfu)} "
                     f"({first.mfu_dtype})")
    if first.note:
        words.append(first.note)
    return {"svg": Markup(svg) if svg else None, "words": words}


def _shares(shares: Mapping[str, float], bottleneck: str) -> list[dict[str, Any]]:
    return [
        {
            "name": cat,
            "share": format_value("share", shares.get(cat)),
            "color": charts.color_of(cat),
            "words": CATEGORY_WORDS.get(cat, ""),
            "is_bottleneck": cat == bottleneck,
        }
        for cat in charts.ordered_categories(shares)
    ]


def _finding(finding: Finding) -> dict[str, Any]:
    return {
        "id": finding.id,
        "category": finding.category,
        "severity": finding.severity,
        "title": finding.title,
        "evidence": [(str(k), format_value(str(k), v)) for k, v in finding.evidence.items()],
        "fixes": [{"title": f.title, "why": f.why, "code": f.code.rstrip("\n"),
                   "frees": format_value("bytes", f.frees_bytes) if f.frees_bytes else "",
                   "verified": verified_line(f.verified) if f.verified else "",
                   "try": f"doctor try --fix {fix_id(finding.id, n)}"
                   if f.apply is not None and not f.verified else ""}
                  for n, f in enumerate(finding.fixes, 1)],
        "speedup": format_speedup(finding.estimated_speedup),
    }


def _table(name: str, frame: pd.DataFrame) -> TableView:
    shown = shown_table(name, frame).head(MAX_TABLE_ROWS)
    columns = [str(c) for c in shown.columns]
    numeric = [pd.api.types.is_numeric_dtype(shown[c]) and not pd.api.types.is_bool_dtype(shown[c])
               for c in shown.columns]
    rows = [[format_value(col, value) for col, value in zip(columns, row, strict=True)]
            for row in shown.itertuples(index=False, name=None)]
    title = TABLE_TITLES.get(name, name.replace("_", " ").capitalize())
    return TableView(name, title, columns, numeric, rows, max(len(frame) - len(shown), 0))
