"""What ``doctor run`` prints after the job: the run's verdict and report (or the line that says
why there is none), and on a node of a multi-node job its own and, from the last node to
finish, the whole job's. None of it ever changes the job's exit status."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from doctor.analyse.analysis import Analysis
    from doctor.nodes import Node


def summarise(run_dir: Path) -> None:
    """Analyse and report; a failure here never changes the job's exit status."""
    analysis = _finalize(run_dir)
    if analysis is not None:
        _print_summary(analysis, run_dir)


def _finalize(run_dir: Path) -> Analysis | None:
    """The run's verdict and report, written; None (and a line saying why) when they could not
    be made."""
    from doctor.outputs import finalize_run

    try:
        return finalize_run(run_dir)
    except Exception as err:  # the job ran; say why there is no report, keep its status
        click.echo(f"doctor: could not analyse the run in {run_dir}: "
                   f"{type(err).__name__}: {err}", err=True)
        return None


def _print_summary(analysis: Analysis, run_dir: Path) -> None:
    from doctor.reports.text import render_text
    from doctor.store import layout
    from doctor.store.rundir import report_path

    click.echo("", err=True)
    click.echo(render_text(analysis, report_path=str(report_path(run_dir))), err=True)
    if (run_dir / layout.TIMELINE).is_file():
        click.echo(f"Timeline: {run_dir / layout.TIMELINE} (ui.perfetto.dev or chrome://tracing)",
                   err=True)


def summarise_node(job_dir: Path, run_dir: Path, node: Node) -> None:
    """Node ``node``'s own verdict and report; then the whole job's, written into ``job_dir``
    and printed instead, when this node is the last to finish. Never changes the exit status."""
    from doctor.outputs import NodeFinish, finish_node
    from doctor.store.rundir import report_path

    analysis = _finalize(run_dir)
    finish: NodeFinish | None = None
    try:
        finish = finish_node(job_dir, run_dir, node)
    except Exception as err:  # the node's own report stands; the job's can be made later
        click.echo(f"doctor: could not merge the nodes' runs in {job_dir}: "
                   f"{type(err).__name__}: {err} (`doctor report {job_dir}` makes it later)",
                   err=True)
    if finish is not None and finish.merged is not None:
        _print_summary(finish.merged, job_dir)
        click.echo(f"doctor: every node has finished: this is the job's verdict over "
                   f"{finish.nodes.nnodes} nodes; node {node.rank}'s own report is "
                   f"{report_path(run_dir)}", err=True)
        return
    if analysis is not None:
        _print_summary(analysis, run_dir)
    if finish is None:
        return
    waiting = finish.waiting_for
    if waiting:
        click.echo(f"doctor: node {node.rank} of {finish.nodes.nnodes} is done; "
                   f"{_nodes_text(waiting)} still running: the last node to finish writes the "
                   f"job's merged report into {job_dir} (or run `doctor report {job_dir}` once "
                   "they have)", err=True)
    else:
        click.echo(f"doctor: every node has finished; another node is writing the job's merged "
                   f"report into {job_dir}", err=True)


def _nodes_text(nodes: list[int]) -> str:
    return ("node " if len(nodes) == 1 else "nodes ") + ", ".join(map(str, nodes))
