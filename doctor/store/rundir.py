"""Run directories as a whole: make one, find the newest, the run record (``run.json``), and
what is done to one after the job (compress its traces, measure it, write the outputs).

The layout is doctor.store.layout's. The run record carries the format (``schema``): a run
directory of a format this doctor does not read is refused in one line that says what to do,
not read as empty.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from doctor.errors import RunDirError, RunFormatError, UsageError
from doctor.store import layout

DEFAULT_ROOT = Path("doctor-runs")


def new_run_dir(out: Path | None, name: str, root: Path = DEFAULT_ROOT) -> Path:
    """Create the run directory (``--out`` or ``./doctor-runs/<timestamp>-<name>``)."""
    if out is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:40] or "job"
        out = root / f"{stamp}-{safe}"
        n = 1
        while out.exists():
            n += 1
            out = root / f"{stamp}-{safe}-{n}"
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".doctor-write-check"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise UsageError(f"cannot write the run directory {out}: {err.strerror or err}") from err
    return out.resolve()


def newest_run(root: Path = DEFAULT_ROOT) -> Path:
    runs = list(root.glob(f"*/{layout.RUN_RECORD}")) if root.is_dir() else []
    if not runs:
        raise RunDirError(f"no runs under ./{root}: run `doctor run train.py` first, "
                          "or name a run directory or trace file")
    return max(runs, key=lambda p: p.stat().st_mtime).parent


def write_run_record(run_dir: Path, record: dict[str, Any]) -> None:
    tmp = run_dir / (layout.RUN_RECORD + ".tmp")
    tmp.write_text(json.dumps({"schema": layout.FORMAT, **record}, indent=2, default=str))
    tmp.replace(run_dir / layout.RUN_RECORD)


def read_run_record(run_dir: Path) -> dict[str, Any]:
    path = run_dir / layout.RUN_RECORD
    if not path.is_file():
        raise RunDirError(f"{run_dir} is not a doctor run directory (no {layout.RUN_RECORD})")
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise RunDirError(f"{path} is unreadable: {err}") from err
    schema = record.get("schema") if isinstance(record, dict) else None
    if schema not in layout.READS:
        if isinstance(schema, str) and schema.startswith("doctor.run/"):
            raise RunFormatError(
                f"{run_dir} was recorded in format {schema}; this doctor reads "
                f"{' and '.join(layout.READS)}: record the job again with this doctor run, or "
                "report it with the doctor that recorded it")
        raise RunDirError(f"{path} is not a doctor run record (schema {schema!r})")
    return dict(record)


def gzip_traces(run_dir: Path) -> None:
    """Compress each exported trace.json in place (done after the job, off its thread)."""
    for path in layout.uncompressed_traces(run_dir):
        target = path.with_name(layout.TRACE_GZ)
        try:
            with open(path, "rb") as src, gzip.open(target, "wb", compresslevel=5) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            os.unlink(path)
        except OSError:
            target.unlink(missing_ok=True)


def disk_usage_bytes(run_dir: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(run_dir):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


def write_outputs(run_dir: Path, verdict_json: str, report_html: str) -> None:
    """The verdict and the report beside the records."""
    (run_dir / layout.VERDICT).write_text(verdict_json)
    (run_dir / layout.REPORT).write_text(report_html, encoding="utf-8")


def report_path(run_dir: Path) -> Path:
    return run_dir / layout.REPORT
