"""``doctor run`` from the command line's arguments to the exit status, as one library call:
resolve the command, make and claim the run directory (a node's folder on a node of a
multi-node job), run the job (doctor.launch), and say what it found (doctor.run_summary). The
job's exit status is the one returned, whatever doctor could or could not do.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

import click

from doctor.command import resolve_command
from doctor.compat import numpy_mismatch
from doctor.errors import UsageError
from doctor.launch import JobResult, Launch, no_room, no_room_line, run_bare, run_job
from doctor.nodes import node_of
from doctor.progress import Say
from doctor.record.window import Window
from doctor.run_summary import summarise, summarise_node
from doctor.store import layout
from doctor.store.rundir import new_node_dir, new_run_dir, write_node_record


def run_and_report(command: Sequence[str], *, out: Path | None, window: Window, force: bool,
                   say: Say | None) -> int:
    """Run ``command`` (as typed after ``doctor run``) recorded into ``out`` (default: a new
    folder under ./doctor-runs), then analyse and summarise it; ``say`` hears the progress
    lines (None: quiet). The job's exit status."""
    job = resolve_command(tuple(command))
    node = node_of(job.argv, os.environ)
    launch = Launch(progress=say, warm_report=True)
    if (mismatch := numpy_mismatch()) is not None:
        print(mismatch, file=sys.stderr)
    if node is None:
        try:
            run_dir = new_run_dir(out, job.name, force=force)
        except UsageError as err:  # no room for it (a full or read-only disk): run it bare
            if (full := no_room(err)) is None:
                raise
            where = Path(full.filename) if full.filename else out or Path("doctor-runs")
            return run_bare(job, where.parent if where.name.startswith(".") else where,
                            full, launch).exit_code
        result = run_job(job, run_dir, window=window, launch=launch)
        if not result.bare and not _unwritten(result, run_dir):
            summarise(run_dir)
        return result.exit_code
    if out is None:
        raise UsageError(f"this is node {node.rank} of a {node.nnodes}-node job: give every "
                         "node's doctor run the same --out DIR on a shared filesystem (this "
                         f"node records into {layout.node_dir(Path('DIR'), node.rank)}/)")
    run_dir = new_node_dir(out, node.rank, job.name, force=force)
    write_node_record(run_dir, node.rank, node.nnodes, done=False)
    result = run_job(job, run_dir, window=window, launch=launch)
    summarise_node(run_dir.parent, run_dir, node)
    return result.exit_code


def _unwritten(result: JobResult, run_dir: Path) -> bool:
    """Whether run.json could not be written as the job ended (said in one line)."""
    if result.unwritten is None:
        return False
    click.echo(no_room_line(run_dir, result.unwritten, f"no report (`doctor report {run_dir}` "
                            "makes it once there is room); the exit status is the job's"),
               err=True)
    return True
