"""Finish a run directory: compress traces, analyse, write verdict.json and report.html; and, on
a node of a multi-node job, the whole job's verdict and report once every node has finished."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from doctor.analyse.analysis import Analysis
from doctor.analyse.timeline import run_timeline
from doctor.errors import UsageError
from doctor.nodes import Node
from doctor.pipeline import analyse, analyze_run
from doctor.reports.json import render_json
from doctor.reports.timeline import write_timeline
from doctor.store import layout
from doctor.store.reader import load_run
from doctor.store.rundata import RunData
from doctor.store.rundir import (
    JobNodes,
    claim_merge,
    disk_usage_bytes,
    gzip_traces,
    is_job_dir,
    job_nodes,
    write_node_record,
    write_nodes_record,
    write_outputs,
)

DISK_WARN_BYTES = 100 * 2**20


def finalize_run(run_dir: Path) -> Analysis:
    """Compress the traces; write the timeline, then verdict.json and report.html."""
    from doctor.reports.html import render_html  # matplotlib and jinja2: only for the HTML

    gzip_traces(run_dir)
    run = load_run(run_dir)
    analysis = analyse(run)
    timeline = _write_timeline(run, analysis, run_dir / layout.TIMELINE)
    used = disk_usage_bytes(run_dir)
    if used > DISK_WARN_BYTES:
        analysis.verdict.notes.append(
            f"This run directory holds {used / 2**20:.0f} MB of probe data (over 100 MB).")
    write_outputs(run_dir, render_json(analysis), render_html(analysis, timeline=timeline))
    return analysis


def _write_timeline(run: RunData, analysis: Analysis, path: Path) -> str | None:
    """The run's timeline written to ``path``: its name, for the report to link to; None (and a
    note saying why) when it could not be made, which costs the timeline, not the report."""
    try:
        write_timeline(run_timeline(run, analysis.ledger), analysis.source, path)
    except Exception as err:
        analysis.verdict.notes.append(
            f"The timeline could not be written ({type(err).__name__}: {err}); `doctor export "
            f"{path.parent}` tries again.")
        return None
    return path.name


def export_timeline(run_dir: Path, output: Path | None = None) -> Path:
    """``doctor export``: the timeline of a run recorded before (or again), to ``output``
    (default: the run directory's own timeline.json.gz)."""
    dirs = job_nodes(run_dir).dirs if is_job_dir(run_dir) else [run_dir]
    run = load_run(dirs)
    target = output or run_dir / layout.TIMELINE
    try:
        return write_timeline(run_timeline(run, analyse(run).ledger), str(run_dir), target)
    except OSError as err:
        raise UsageError(f"cannot write {target}: {err.strerror or err}") from err


def analyse_runs(dirs: Sequence[Path], steps: tuple[int | None, int | None] | None = None
                 ) -> Analysis:
    """Run directories as one job (doctor.pipeline.analyze_run), a multi-node job's
    directory among them expanded to its node folders in node order, with a note naming the
    node folders that are missing or whose job had not ended."""
    expanded: list[Path] = []
    notes: list[str] = []
    for run_dir in dirs:
        if is_job_dir(run_dir):
            nodes = job_nodes(run_dir)
            expanded += nodes.dirs
            notes += node_notes(nodes)
        else:
            expanded.append(run_dir)
    if len(expanded) > 1:
        _one_job(expanded)
    analysis = analyze_run(expanded, steps)
    analysis.verdict.notes.extend(notes)
    return analysis


def _one_job(dirs: Sequence[Path]) -> None:
    """Several run directories are the nodes of one job only where no rank is in two of them:
    two runs that each hold rank 0 are two runs (a UsageError that says what to do instead)."""
    held: dict[int, Path] = {}
    for run_dir in dirs:
        for rank in sorted({rank for _dir, rank, _role, _pid in layout.process_dirs(run_dir)}):
            if rank in held:
                raise UsageError(
                    f"{held[rank]} and {run_dir} both hold rank {rank}: they are two runs, not "
                    f"the nodes of one job; report each (doctor report {run_dir}), or compare "
                    f"them (doctor compare {held[rank]} {run_dir})")
            held[rank] = run_dir


def node_notes(nodes: JobNodes) -> list[str]:
    """What a report of ``nodes`` lacks: node folders missing, nodes not finished."""
    notes = []
    if nodes.missing:
        notes.append(f"Node folders missing from {nodes.job_dir}: {_names(nodes.missing)}; this "
                     f"report has {len(nodes.recorded)} of the job's {nodes.nnodes} nodes.")
    if nodes.earlier:
        notes.append(f"Node folders holding an earlier job's run (it ended before this job's "
                     f"began), left out: {_names(sorted(nodes.earlier))}.")
    if nodes.running:
        notes.append(f"Unfinished node folders (their job had not ended when this report was "
                     f"made): {_names(nodes.running)}.")
    return notes


def _names(nodes: Sequence[int]) -> str:
    return ", ".join(layout.node_dir(Path(), k).name for k in nodes)


@dataclass(frozen=True)
class NodeFinish:
    """What a node of a multi-node job found when it had finished its own run directory."""

    nodes: JobNodes  # the job's nodes as this node saw them
    merged: Analysis | None  # the job's analysis, when this node wrote the merged outputs

    @property
    def waiting_for(self) -> list[int]:
        """The nodes not finished yet (missing, running, or writing their own report)."""
        return [k for k in range(self.nodes.nnodes) if k not in self.nodes.done]


def finish_node(job_dir: Path, run_dir: Path, node: Node) -> NodeFinish:
    """Mark ``run_dir`` (node ``node`` of the job in ``job_dir``) done; when every node is, and
    this one claims the merge first, write the whole job's verdict and report into ``job_dir``."""
    from doctor.reports.html import render_html  # matplotlib and jinja2: only for the HTML

    write_node_record(run_dir, node.rank, node.nnodes, done=True)
    nodes = job_nodes(job_dir, node.nnodes)
    if not nodes.complete or not claim_merge(nodes):
        return NodeFinish(nodes, None)
    write_nodes_record(job_dir, {
        "schema": layout.NODES_FORMAT, "nnodes": nodes.nnodes,
        "nodes": [d.name for d in nodes.dirs], "merged_by": node.rank, "key": nodes.key,
        "merged": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    run = load_run(nodes.dirs)
    analysis = analyse(run)
    timeline = _write_timeline(run, analysis, job_dir / layout.TIMELINE)
    write_outputs(job_dir, render_json(analysis), render_html(analysis, timeline=timeline))
    return NodeFinish(nodes, analysis)
