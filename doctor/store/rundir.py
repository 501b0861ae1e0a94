"""The run directory: where a run's records live, and how to find and load them.

    RUN_DIR/run.json                 doctor's record of the run (schema doctor.run/1)
    RUN_DIR/host.npz, gpu.npz        samples from the parent (probes.host, probes.gpu)
    RUN_DIR/rank-<R>/<role>-<pid>/   one folder per process of the job that recorded anything:
        meta.json, *.ring, trace.json.gz
    RUN_DIR/verdict.json, report.html
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from doctor.errors import RunDirError, UsageError

RUN_SCHEMA = "doctor.run/1"
DEFAULT_ROOT = Path("doctor-runs")
_PROC_DIR = re.compile(r"^(?P<role>[a-z]+\d*)-(?P<pid>\d+)$")


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
    runs = [p for p in root.glob("*/run.json")] if root.is_dir() else []
    if not runs:
        raise RunDirError(f"no runs under ./{root}: run `doctor run train.py` first, "
                          "or name a run directory or trace file")
    return max(runs, key=lambda p: p.stat().st_mtime).parent


def write_run_record(run_dir: Path, record: dict[str, Any]) -> None:
    tmp = run_dir / "run.json.tmp"
    tmp.write_text(json.dumps({"schema": RUN_SCHEMA, **record}, indent=2, default=str))
    tmp.replace(run_dir / "run.json")


def read_run_record(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "run.json"
    if not path.is_file():
        raise RunDirError(f"{run_dir} is not a doctor run directory (no run.json)")
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise RunDirError(f"{path} is unreadable: {err}") from err
    if record.get("schema") != RUN_SCHEMA:
        raise RunDirError(f"{path} has schema {record.get('schema')!r}, expected {RUN_SCHEMA}")
    return dict(record)


@dataclass
class ProcessRecord:
    """What one process of the job left in its folder."""

    path: Path
    rank: int
    role: str
    pid: int
    meta: dict[str, Any] = field(default_factory=dict)

    def ring_path(self, name: str) -> Path:
        return self.path / f"{name}.ring"

    @property
    def trace(self) -> Path | None:
        for name in ("trace.json.gz", "trace.json"):
            if (self.path / name).is_file():
                return self.path / name
        return None


def list_processes(run_dir: Path) -> list[ProcessRecord]:
    out = []
    for rank_dir in sorted(run_dir.glob("rank-*")):
        try:
            rank = int(rank_dir.name.split("-", 1)[1])
        except ValueError:
            continue
        for proc_dir in sorted(rank_dir.iterdir()):
            m = _PROC_DIR.match(proc_dir.name)
            if not m or not proc_dir.is_dir():
                continue
            try:
                meta = json.loads((proc_dir / "meta.json").read_text())
            except (OSError, json.JSONDecodeError):
                meta = {}
            out.append(ProcessRecord(proc_dir, rank, m["role"], int(m["pid"]), meta))
    return out


def gzip_traces(run_dir: Path) -> None:
    """Compress each exported trace.json in place (done after the job, off its thread)."""
    for path in run_dir.glob("rank-*/*/trace.json"):
        target = path.with_name("trace.json.gz")
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
