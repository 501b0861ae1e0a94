"""``doctor report`` and ``doctor compare`` as library calls: what the paths name
(doctor.sources), analysed, and rendered in the format asked for; the command line only writes
the text where it goes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from doctor.analyse.analysis import Analysis
from doctor.sources import Sources, report_sources, run_dir_argument

Steps = tuple[int | None, int | None]


def report(paths: Sequence[Path], fmt: str, output: Path | None, steps: Steps | None = None
           ) -> tuple[str, Path | None]:
    """The report on ``paths`` (run directories or traces; none: the newest run) as ``fmt``
    (html, json or text), and where it goes: ``output``, else the run's report.html for html
    (a trace's ``<name>.report.html`` beside the working directory), else stdout (None)."""
    from doctor.reports.json import render_json
    from doctor.reports.text import render_text

    found = report_sources(paths, steps=steps is not None)
    analysis, default_html = _load(found, steps)
    if fmt == "html":
        from doctor.reports.html import render_html  # matplotlib and jinja2: only for the HTML

        target = output or default_html
        return render_html(analysis, timeline=_timeline_beside(target, found)), target
    if fmt == "json":
        return render_json(analysis), output
    return render_text(analysis, full=True), output


def compare(run_a: Path, run_b: Path, fmt: str) -> str:
    """Two runs side by side (B against A) as ``fmt`` (text, json or html)."""
    from doctor.analyse.compare import compare as compare_runs
    from doctor.pipeline import analyze_run
    from doctor.reports.tries import render_compare_html, render_compare_json, render_compare_text

    run_a, run_b = run_dir_argument(run_a), run_dir_argument(run_b)
    comparison = compare_runs(analyze_run(run_a), analyze_run(run_b))
    if fmt == "text":
        return render_compare_text(comparison)
    if fmt == "json":
        return render_compare_json(comparison)
    return render_compare_html(comparison)


def _load(found: Sources, steps: Steps | None = None
          ) -> tuple[Analysis, Path]:
    from doctor.store.rundir import report_path

    if found.traces:
        from doctor.pipeline import analyze_traces

        traces = list(found.traces)
        return analyze_traces(traces), Path(traces[0].name.split(".")[0] + ".report.html")
    from doctor.outputs import analyse_runs

    return analyse_runs(list(found.runs), steps), report_path(found.runs[0])


def _timeline_beside(report: Path, found: Sources) -> str | None:
    """Where the run's timeline is for a report written to ``report``: its name when the report
    sits beside it, else its absolute path; None for traces, or a run without one."""
    from doctor.store import layout

    if found.traces or len(found.runs) > 1:
        return None
    run_dir = found.runs[0]
    timeline = run_dir / layout.TIMELINE
    if not timeline.is_file():
        return None
    if report.resolve().parent == run_dir.resolve():
        return timeline.name
    return str(timeline.resolve())
