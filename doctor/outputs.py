"""Finish a run directory: compress traces, analyse, write verdict.json and report.html."""

from __future__ import annotations

from pathlib import Path

from doctor.analyse.pipeline import analyze_run
from doctor.reports.html import render_html
from doctor.reports.json import render_json
from doctor.store.rundir import disk_usage_bytes, gzip_traces, write_outputs
from doctor.verdict import Analysis

DISK_WARN_BYTES = 100 * 2**20


def finalize_run(run_dir: Path) -> Analysis:
    gzip_traces(run_dir)
    analysis = analyze_run(run_dir)
    used = disk_usage_bytes(run_dir)
    if used > DISK_WARN_BYTES:
        analysis.verdict.notes.append(
            f"This run directory holds {used / 2**20:.0f} MB of probe data (over 100 MB).")
    write_outputs(run_dir, render_json(analysis), render_html(analysis))
    return analysis
