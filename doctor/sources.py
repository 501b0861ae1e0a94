"""What a path on the command line names, decided in one place for every command that reads runs
(``doctor report``, ``export``, ``compare``, ``try``): a run directory (a run's own, or a
multi-node job's holding node-K folders), trace files (torch.profiler's ``*.json`` /
``*.json.gz``, one per rank), or nothing, which means the newest run under the run root
(./doctor-runs). A path that names none of them is a UsageError (one line).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from doctor.errors import UsageError
from doctor.store import layout
from doctor.store.rundir import is_job_dir, newest_run

TRACE_SUFFIXES = (".json", ".json.gz")


@dataclass(frozen=True)
class Sources:
    """What ``doctor report`` reads: run directories, or trace files (never both)."""

    runs: tuple[Path, ...] = ()
    traces: tuple[Path, ...] = ()


def report_sources(paths: Sequence[Path], *, steps: bool = False) -> Sources:
    """The run directories or traces ``paths`` name (none: the newest run); ``steps``: whether
    a step range was asked for (it applies to run directories only)."""
    paths = list(paths) or [newest_run()]
    missing = [p for p in paths if not p.exists()]
    if missing:
        raise UsageError(f"no such run directory or trace: {missing[0]}")
    tries = [p for p in paths if is_try_dir(p)]
    if tries:
        raise UsageError(f"{tries[0]} is a doctor try, not a run: its report is "
                         f"{tries[0] / layout.REPORT}, and each attempt in it is a run directory")
    dirs = tuple(p for p in paths if p.is_dir())
    traces = tuple(p for p in paths if p.is_file())
    if dirs and traces:
        raise UsageError("give either run directories or trace files, not both")
    if traces:
        bad = [t for t in traces if not t.name.endswith(TRACE_SUFFIXES)]
        if bad:
            raise UsageError(f"{bad[0]} is not a trace (*.json or *.json.gz)")
        ours = [t for t in traces if t.name == layout.TIMELINE
                and (t.parent / layout.RUN_RECORD).is_file()]
        if ours:
            raise UsageError(f"{ours[0]} is doctor's own timeline of the run in {ours[0].parent} "
                             "(open it in ui.perfetto.dev), not a torch.profiler trace: its "
                             f"report is doctor report {ours[0].parent}")
        if steps:
            raise UsageError("--steps applies to run directories, not to traces")
    return Sources(dirs, traces)


def run_dir_argument(path: Path | None) -> Path:
    """The run directory ``path`` names for ``doctor export`` and ``doctor compare`` (none: the
    newest run); a UsageError (one line) when it is not a directory."""
    run_dir = path or newest_run()
    if not run_dir.is_dir():
        raise UsageError(f"no such run directory: {run_dir}")
    return run_dir


def try_run_argument(path: Path | None) -> Path:
    """The run ``doctor try`` re-runs (none: the newest): one launcher's run directory, so not
    a multi-node job's directory (one of its node folders is)."""
    run_dir = path or newest_run()
    if is_job_dir(run_dir):
        raise UsageError(f"{run_dir} holds the nodes of a multi-node job, and doctor try re-runs "
                         "one launcher: try one node's folder in it, or a single-node run")
    return run_dir


def is_try_dir(path: Path) -> bool:
    """Whether ``path`` is a ``doctor try``'s folder (its attempts are run directories)."""
    return (path / layout.TRY_RECORD).is_file()
