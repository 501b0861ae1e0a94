"""The ``doctor`` command line: each command parses, calls one library function, and exits.

Errors a user can hit are DoctorError subclasses, printed as one line (exit status 2).
``doctor run`` otherwise exits with the job's own status.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from doctor.errors import DoctorError, UsageError
from doctor.version import __version__

if TYPE_CHECKING:
    from doctor.analyse.analysis import Analysis
    from doctor.launch import JobResult

TRACE_SUFFIXES = (".json", ".json.gz")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="doctor")
def cli() -> None:
    """Where does my training step time go, and what do I change to get it back?"""


@cli.command(context_settings={"ignore_unknown_options": True,
                               "allow_interspersed_args": False})
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Run directory (default: ./doctor-runs/<timestamp>-<name>).")
@click.option("--window", default=None, metavar="START,STEPS",
              help="Profile STEPS steps from step START with torch.profiler (default 8,5: "
                   "steps 8-12); 'off' to skip it.")
@click.option("--force", is_flag=True,
              help="Replace the earlier run in --out (its files are removed first); without "
                   "it, an --out holding a run is refused.")
@click.option("--quiet", "-q", is_flag=True,
              help="Print only the summary at the end (no line as the job starts, none as the "
                   "profiler window opens and closes).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run(out: Path | None, window: str | None, force: bool, quiet: bool,
        command: tuple[str, ...]) -> None:
    """Profile a training job: doctor run [OPTIONS] [--] COMMAND [ARGS]...

    COMMAND is what you would type: train.py ARGS, python train.py ARGS,
    python -m pkg.train ARGS, torchrun --nproc-per-node 2 train.py. The exit status is the
    job's own.

    A run directory holds one run: an --out holding an earlier run is refused (--force
    replaces it), and so is one that another doctor run is recording into.

    On several nodes, give every node the same --out DIR on a shared filesystem: node K
    records into DIR/node-K/ (the rules above apply to that folder), and the last node to
    finish writes the job's report into DIR.
    """
    from doctor.command import resolve_command
    from doctor.compat import numpy_mismatch
    from doctor.launch import Launch, no_room, run_bare, run_job
    from doctor.nodes import node_of
    from doctor.run_summary import summarise, summarise_node
    from doctor.store import layout
    from doctor.store.rundir import new_node_dir, new_run_dir, write_node_record

    if window is not None and window.lower() != "off" and not _valid_window(window):
        raise UsageError(f"--window takes START,STEPS (e.g. 8,5) or off, not {window!r}")
    job = resolve_command(command)
    node = node_of(job.argv, os.environ)
    launch = Launch(progress=None if quiet else _say)
    if (mismatch := numpy_mismatch()) is not None:
        print(mismatch, file=sys.stderr)
    if node is None:
        try:
            run_dir = new_run_dir(out, job.name, force=force)
        except UsageError as err:  # no room for it (a full or read-only disk): run it bare
            if (full := no_room(err)) is None:
                raise
            where = Path(full.filename) if full.filename else out or Path("doctor-runs")
            sys.exit(run_bare(job, where.parent if where.name.startswith(".") else where,
                              full, launch).exit_code)
        result = run_job(job, run_dir, window=window, launch=launch)
        if not result.bare and not _unwritten(result, run_dir):
            summarise(run_dir)
        sys.exit(result.exit_code)
    if out is None:
        raise UsageError(f"this is node {node.rank} of a {node.nnodes}-node job: give every "
                         "node's doctor run the same --out DIR on a shared filesystem (this "
                         f"node records into {layout.node_dir(Path('DIR'), node.rank)}/)")
    run_dir = new_node_dir(out, node.rank, job.name, force=force)
    write_node_record(run_dir, node.rank, node.nnodes, done=False)
    result = run_job(job, run_dir, window=window, launch=launch)
    summarise_node(run_dir.parent, run_dir, node)
    sys.exit(result.exit_code)


def _unwritten(result: JobResult, run_dir: Path) -> bool:
    """Whether run.json could not be written as the job ended (said in one line)."""
    if result.unwritten is None:
        return False
    from doctor.launch import no_room_line

    click.echo(no_room_line(run_dir, result.unwritten, f"no report (`doctor report {run_dir}` "
                            "makes it once there is room); the exit status is the job's"),
               err=True)
    return True


def _say(line: str) -> None:
    """A progress line of doctor run (doctor.progress), on stderr beside the job's own."""
    click.echo(line, err=True)


def _valid_window(text: str) -> bool:
    parts = text.split(",")
    return len(parts) == 2 and all(p.strip().isdigit() and int(p) > 0 for p in parts)


@cli.command()
@click.argument("sources", nargs=-1, type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["html", "json", "text"]), default="html",
              show_default=True)
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Write here (default: RUN_DIR/report.html for html, stdout otherwise).")
@click.option("--steps", "step_range", default=None, metavar="FIRST:LAST",
              help="Analyse only these steps of a run directory (1-based, inclusive; either "
                   "end may be left open, e.g. 100: or :400), to leave out an evaluation "
                   "phase or a change of settings.")
def report(sources: tuple[Path, ...], fmt: str, output: Path | None,
           step_range: str | None) -> None:
    """Report on a run directory (default: the newest under ./doctor-runs) or on
    torch.profiler traces (*.json, *.json.gz, one per rank)."""
    from doctor.reports.json import render_json
    from doctor.reports.text import render_text

    steps = parse_step_range(step_range) if step_range is not None else None
    analysis, default_html = _load(list(sources), steps)
    target: Path | None
    if fmt == "html":
        from doctor.reports.html import render_html  # matplotlib and jinja2: only for the HTML

        target = output or default_html
        text = render_html(analysis, timeline=_timeline_beside(target, sources))
    elif fmt == "json":
        text, target = render_json(analysis), output
    else:
        text, target = render_text(analysis, full=True), output
    _emit(text, target)


def _timeline_beside(report: Path, sources: tuple[Path, ...]) -> str | None:
    """Where the run's timeline is for a report written to ``report``: its name when the report
    sits beside it, else its absolute path; None for traces, or a run without one."""
    from doctor.store import layout
    from doctor.store.rundir import newest_run

    run_dir = sources[0] if sources else newest_run()
    timeline = run_dir / layout.TIMELINE
    if len(sources) > 1 or not timeline.is_file():
        return None
    if report.resolve().parent == run_dir.resolve():
        return timeline.name
    return str(timeline.resolve())


def _emit(text: str, target: Path | None) -> None:
    """``text`` to stdout, or into ``target`` (whose path is then printed), through a new file
    renamed over it: a link at ``target`` is replaced, never written through."""
    from doctor.store.safe_files import write_text_atomic

    if target is None:
        click.echo(text, nl=not text.endswith("\n"))
        return
    try:
        write_text_atomic(target, text)
    except OSError as err:
        raise UsageError(f"cannot write {target}: {err.strerror or err}") from err
    click.echo(str(target))


def parse_step_range(text: str) -> tuple[int | None, int | None]:
    """``FIRST:LAST``, ``FIRST:`` or ``:LAST`` (1-based, inclusive) as (first, last)."""
    parts = text.split(":")
    ok = len(parts) == 2 and all(not p.strip() or p.strip().isdigit() for p in parts)
    first, last = (int(p) if ok and p.strip() else None for p in [*parts, "", ""][:2])
    if not ok or first == 0 or last == 0 or (first and last and last < first):
        raise UsageError(f"--steps takes FIRST:LAST, counted from 1 (e.g. 20:300, 20: or :300), "
                         f"not {text!r}")
    return first, last


def _load(sources: list[Path], steps: tuple[int | None, int | None] | None = None
          ) -> tuple[Analysis, Path]:
    from doctor.store.rundir import newest_run, report_path

    if not sources:
        sources = [newest_run()]
    missing = [s for s in sources if not s.exists()]
    if missing:
        raise UsageError(f"no such run directory or trace: {missing[0]}")
    from doctor.store import layout

    tries = [s for s in sources if (s / layout.TRY_RECORD).is_file()]
    if tries:
        raise UsageError(f"{tries[0]} is a doctor try, not a run: its report is "
                         f"{tries[0] / layout.REPORT}, and each attempt in it is a run directory")
    dirs = [s for s in sources if s.is_dir()]
    traces = [s for s in sources if s.is_file()]
    if dirs and traces:
        raise UsageError("give either run directories or trace files, not both")
    if traces:
        bad = [t for t in traces if not t.name.endswith(TRACE_SUFFIXES)]
        if bad:
            raise UsageError(f"{bad[0]} is not a trace (*.json or *.json.gz)")
        if steps is not None:
            raise UsageError("--steps applies to run directories, not to traces")
        from doctor.pipeline import analyze_traces

        return analyze_traces(traces), Path(traces[0].name.split(".")[0] + ".report.html")
    from doctor.outputs import analyse_runs

    return analyse_runs(dirs, steps), report_path(dirs[0])


@cli.command("try")
@click.argument("run_dir", required=False, type=click.Path(path_type=Path))
@click.option("--fix", "fixes", multiple=True, metavar="ID",
              help="A fix of the run to try (ID from the plan, e.g. input.loader:1, or a "
                   "finding id for its fixes); repeatable. Default: every fix that needs no "
                   "code, alone, then the compatible ones together.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="A setting to try, e.g. num_workers=4, pin_memory=true, num_threads=1, "
                   "bucket_cap_mb=50, PYTORCH_CUDA_ALLOC_CONF=...; several values sweep them "
                   "(num_workers=0,2,4,8); repeatable.")
@click.option("--steps", type=int, default=30, show_default=True,
              help="Steady steps to measure each setting (and the baseline) over, in all.")
@click.option("--repeat", type=int, default=2, show_default=True,
              help="Rounds of baseline and settings, alternated so that load drift cancels.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask before re-running the job.")
@click.option("--dry-run", is_flag=True, help="Say what would run, and stop.")
def try_(run_dir: Path | None, fixes: tuple[str, ...], sets: tuple[str, ...], steps: int,
         repeat: int, yes: bool, dry_run: bool) -> None:
    """Re-run the run's command with fixes applied (no code change), stop it after a few
    steps, and measure the speedup against the estimate (default: the newest run)."""
    from doctor.outputs import finalize_run
    from doctor.reports.tries import render_try_html, render_try_text
    from doctor.store import layout
    from doctor.store.rundir import is_job_dir, newest_run
    from doctor.store.safe_files import write_text_atomic
    from doctor.tries.runner import execute, plan_lines, prepare

    run_dir = run_dir or newest_run()
    if is_job_dir(run_dir):
        raise UsageError(f"{run_dir} holds the nodes of a multi-node job, and doctor try re-runs "
                         "one launcher: try one node's folder in it, or a single-node run")
    prepared = prepare(run_dir, fixes, sets, steps, repeat)
    for line in plan_lines(prepared):
        click.echo(line, err=True)
    if dry_run:
        return
    _allowed_to_run(yes)
    record = execute(prepared, lambda line: click.echo(line, err=True))
    try_dir = Path(record.dir)
    write_text_atomic(try_dir / layout.REPORT, render_try_html(record))
    try:
        finalize_run(run_dir)  # the run's own verdict and report now say what was measured
    except Exception as err:
        click.echo(f"doctor: could not update the run's report: {type(err).__name__}: {err}",
                   err=True)
    click.echo(render_try_text(record, report=str(try_dir / layout.REPORT)), nl=False)


def _allowed_to_run(yes: bool) -> None:
    """Whether doctor try may run the job: ``--yes``, or a yes typed at a terminal. Without a
    terminal to ask on (CI, a pipe, an IDE) and without ``--yes``, nothing runs: the plan was
    printed, and one line says how to run it (exit status 2)."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise UsageError("doctor try runs the job again only when told to: stdin is not a "
                         "terminal to ask on, so pass --yes to run the plan above")
    click.confirm("The job will run again (it may write checkpoints or logs each time). "
                  "Go on?", abort=True, err=True)


@cli.command()
@click.argument("run_a", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.argument("run_b", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--format", "fmt", type=click.Choice(["text", "json", "html"]), default="text",
              show_default=True)
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Write here (default: stdout).")
def compare(run_a: Path, run_b: Path, fmt: str, output: Path | None) -> None:
    """Two runs side by side: step time, speedup (B against A) and shares."""
    from doctor.analyse.compare import compare as compare_runs
    from doctor.pipeline import analyze_run
    from doctor.reports.tries import render_compare_html, render_compare_json, render_compare_text

    comparison = compare_runs(analyze_run(run_a), analyze_run(run_b))
    text = (render_compare_text(comparison) if fmt == "text" else
            render_compare_json(comparison) if fmt == "json" else
            render_compare_html(comparison))
    _emit(text, output)


@cli.command()
@click.argument("run_dir", required=False, type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Write here (default: RUN_DIR/timeline.json.gz).")
def export(run_dir: Path | None, output: Path | None) -> None:
    """The run on a time axis: a Chrome-trace / Perfetto file (timeline.json.gz) of its steps,
    DataLoader waits, workers' fetches, samples and profiler window, for ui.perfetto.dev or
    chrome://tracing (default: the newest run)."""
    from doctor.outputs import export_timeline
    from doctor.store.rundir import newest_run

    run_dir = run_dir or newest_run()
    if not run_dir.is_dir():
        raise UsageError(f"no such run directory: {run_dir}")
    click.echo(str(export_timeline(run_dir, output)))


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except DoctorError as err:
        click.echo(f"doctor: {err}", err=True)
        sys.exit(err.exit_code)
    except click.exceptions.Abort:
        click.echo("doctor: aborted", err=True)
        sys.exit(130)
    except click.ClickException as err:
        err.show()
        sys.exit(2)
    except click.exceptions.Exit as err:
        sys.exit(err.exit_code)


if __name__ == "__main__":
    main()
