"""The ``doctor`` command line: each command parses, calls one library function, and exits.

Errors a user can hit are DoctorError subclasses, printed as one line (exit status 2).
``doctor run`` otherwise exits with the job's own status.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from doctor.errors import DoctorError, UsageError
from doctor.version import __version__


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
@click.option("--rewindow", type=click.Choice(["on", "off"]), default=None,
              help="Open the profiler window again where the run slows down for a sustained "
                   "stretch (default on; the first window is --window's).")
@click.option("--force", is_flag=True,
              help="Replace the earlier run in --out (its files are removed first); without "
                   "it, an --out holding a run is refused.")
@click.option("--quiet", "-q", is_flag=True,
              help="Print only the summary at the end (no line as the job starts, none as the "
                   "profiler window opens and closes).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run(out: Path | None, window: str | None, rewindow: str | None, force: bool, quiet: bool,
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
    from doctor.record.window import parse_window, window_of
    from doctor.run_door import run_and_report

    # the job's window, checked before anything runs (an inherited DOCTOR_WINDOW too)
    job_window = parse_window(window) if window is not None else window_of(os.environ)
    if rewindow is not None:  # the job's processes read it (doctor.record.drift)
        from doctor.record.drift import ENV_REWINDOW

        os.environ[ENV_REWINDOW] = rewindow
    sys.exit(run_and_report(command, out=out, window=job_window, force=force,
                            say=None if quiet else _say))


def _say(line: str) -> None:
    """A progress line of doctor run (doctor.progress), on stderr beside the job's own."""
    click.echo(line, err=True)


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
    from doctor.reporting import report as render_report

    steps = parse_step_range(step_range) if step_range is not None else None
    text, target = render_report(sources, fmt, output, steps)
    _emit(text, target)


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
    from doctor.sources import try_run_argument
    from doctor.tries.runner import plan_lines, prepare, run_try

    prepared = prepare(try_run_argument(run_dir), fixes, sets, steps, repeat)
    for line in plan_lines(prepared):
        click.echo(line, err=True)
    if dry_run:
        return
    _allowed_to_run(yes)  # the one step between the plan and its run: asking the user
    click.echo(run_try(prepared, lambda line: click.echo(line, err=True)), nl=False)


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
@click.argument("run_a", type=click.Path(path_type=Path))
@click.argument("run_b", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["text", "json", "html"]), default="text",
              show_default=True)
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Write here (default: stdout).")
def compare(run_a: Path, run_b: Path, fmt: str, output: Path | None) -> None:
    """Two runs side by side: step time, speedup (B against A) and shares."""
    from doctor.reporting import compare as render_compare

    text = render_compare(run_a, run_b, fmt)
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
    from doctor.sources import run_dir_argument

    click.echo(str(export_timeline(run_dir_argument(run_dir), output)))


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
