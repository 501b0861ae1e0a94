"""The ``doctor`` command line: each command parses, calls one library function, and exits.

Errors a user can hit are DoctorError subclasses, printed as one line (exit status 2).
``doctor run`` otherwise exits with the job's own status.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from doctor.errors import DoctorError, UsageError
from doctor.version import __version__

if TYPE_CHECKING:
    from doctor.verdict import Analysis

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
              help="Profile steps START..START+STEPS with torch.profiler (default 8,5); "
                   "'off' to skip it.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run(out: Path | None, window: str | None, command: tuple[str, ...]) -> None:
    """Profile a training job: doctor run [OPTIONS] [--] COMMAND [ARGS]...

    COMMAND is what you would type: train.py ARGS, python train.py ARGS,
    python -m pkg.train ARGS, torchrun --nproc-per-node 2 train.py. The exit status is the
    job's own.
    """
    from doctor.command import resolve_command
    from doctor.launch import run_job
    from doctor.store.rundir import new_run_dir

    if window is not None and window.lower() != "off" and not _valid_window(window):
        raise UsageError(f"--window takes START,STEPS (e.g. 8,5) or off, not {window!r}")
    job = resolve_command(command)
    run_dir = new_run_dir(out, job.name)
    result = run_job(job, run_dir, window=window)
    _summarise(run_dir)
    sys.exit(result.exit_code)


def _valid_window(text: str) -> bool:
    parts = text.split(",")
    return len(parts) == 2 and all(p.strip().isdigit() and int(p) > 0 for p in parts)


def _summarise(run_dir: Path) -> None:
    """Analyse and report; a failure here never changes the job's exit status."""
    from doctor.outputs import finalize_run
    from doctor.reports.text import render_text
    from doctor.store.rundir import report_path

    try:
        analysis = finalize_run(run_dir)
    except Exception as err:  # the job ran; say why there is no report, keep its status
        click.echo(f"doctor: could not analyse the run in {run_dir}: "
                   f"{type(err).__name__}: {err}", err=True)
        return
    click.echo("", err=True)
    click.echo(render_text(analysis, report_path=str(report_path(run_dir))), err=True)


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
    from doctor.reports.html import render_html
    from doctor.reports.json import render_json
    from doctor.reports.text import render_text

    steps = parse_step_range(step_range) if step_range is not None else None
    analysis, default_html = _load(list(sources), steps)
    target: Path | None
    if fmt == "html":
        text = render_html(analysis)
        target = output or default_html
    elif fmt == "json":
        text, target = render_json(analysis), output
    else:
        text, target = render_text(analysis, full=True), output
    if target is None:
        click.echo(text, nl=not text.endswith("\n"))
        return
    try:
        target.write_text(text, encoding="utf-8")
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
    from doctor.analyse.pipeline import analyze_run, analyze_traces
    from doctor.store.rundir import newest_run, report_path

    if not sources:
        sources = [newest_run()]
    missing = [s for s in sources if not s.exists()]
    if missing:
        raise UsageError(f"no such run directory or trace: {missing[0]}")
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
        return analyze_traces(traces), Path(traces[0].name.split(".")[0] + ".report.html")
    return analyze_run(dirs, steps), report_path(dirs[0])


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
