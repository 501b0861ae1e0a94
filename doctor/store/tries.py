"""The tries of a run: ``RUN_DIR/tries/<stamp>/`` (layout in doctor.store.layout).

``doctor try`` writes one folder per try, with its record (``try.json``, schema TRY_FORMAT) and
one run directory per attempt; the job's output of each attempt is kept as its tail. The
analysis of the original run reads the records back (``read_tries``) to say, beside each fix,
what a try of it measured.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from doctor.store import layout

from ..errors import RecordSchemaError, UsageError
from .process_meta import read_meta
from .redact import redact_argv
from .safe_files import write_atomic, write_text_atomic
from .try_record import TRY_FORMAT, TryRecord

OUTPUT_TAIL_BYTES = 64 * 1024  # of each attempt's stdout and stderr


def new_try_dir(run_dir: Path) -> Path:
    """A new folder ``tries/<stamp>`` in the run directory (never through a link planted as
    ``tries``)."""
    root = run_dir / layout.TRIES
    if root.is_symlink():
        raise UsageError(f"{root} is a symbolic link: doctor try writes only inside the run "
                         "directory (remove the link)")
    root.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1, 10_000):  # two tries started in the same second get a folder each
        out = root / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            out.mkdir()
            return out
        except FileExistsError:
            continue
    raise UsageError(f"{root} holds too many tries started at {stamp}")


def attempt_dir(try_dir: Path, round_: int, arm: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in arm)[:60]
    return try_dir / f"{round_}-{safe}"


def output_paths(attempt: Path) -> tuple[Path, Path]:
    return attempt / layout.STDOUT, attempt / layout.STDERR


def keep_tail(path: Path, limit: int = OUTPUT_TAIL_BYTES) -> str:
    """Cut a job's output file down to its last ``limit`` bytes; the text of that tail."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            if size > limit:
                f.seek(size - limit)
            tail = f.read()
        if size > limit:
            write_atomic(path, tail)
    except OSError:
        return ""
    return tail.decode("utf-8", "replace")


def process_notes(run_dir: Path) -> dict[str, Any]:
    """What the job's processes said of a try: the settings they met (``tried``, merged over the
    processes), what could not be applied, whether doctor stopped them, and their pids."""
    seen: list[dict[str, dict[str, Any]]] = []
    errors: list[str] = []
    stopped = False
    pids: list[int] = []
    for proc_dir, _rank, _role, pid in layout.process_dirs(run_dir):
        pids.append(pid)
        meta = read_meta(proc_dir)
        stopped = stopped or meta.stopped_at_step is not None
        errors += [e for e in meta.tried_errors if e not in errors]
        seen.append(dict(meta.tried))
    return {"tried": merge_tried(seen), "errors": errors, "stopped": stopped, "pids": pids}


def merge_tried(parts: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Several processes' (or attempts') ``tried`` as one: per setting, the value tried, every
    value the job had, how often it was applied, and the value the job itself asked for last."""
    tried: dict[str, dict[str, Any]] = {}
    for part in parts:
        for setting, entry in part.items():
            merged = tried.setdefault(setting, {"tried": entry.get("tried"), "job": [],
                                                "applied": 0})
            merged["job"] += list(entry.get("job") or [])
            merged["applied"] += int(entry.get("applied") or 0)
            if "asked" in entry:
                merged["asked"] = entry["asked"]
    return tried


def write_try(try_dir: Path, record: TryRecord) -> Path:
    """The try's record, its ``command`` with secrets hidden (doctor.store.redact)."""
    path = try_dir / layout.TRY_RECORD
    data = record.to_dict()
    if isinstance(data.get("command"), list):
        data = {**data, "command": redact_argv(data["command"])}
    write_text_atomic(path, json.dumps({"schema": TRY_FORMAT, **data}, indent=2, default=str))
    return path


def read_try(path: Path) -> TryRecord | None:
    """A try record, or None when it is unreadable (not a regular file of its own, too large,
    not JSON: doctor.store.readback), of another format, or not of a try record's shape
    (doctor.store.try_record.check_try)."""
    from .readback import Unreadable, read_json

    try:
        record = read_json(path)
    except Unreadable:
        return None
    if not isinstance(record, dict) or record.get("schema") != TRY_FORMAT:
        return None
    try:
        return TryRecord.from_dict(record)
    except RecordSchemaError:
        return None


def read_tries(run_dir: Path) -> list[TryRecord]:
    """Every readable try of the run, oldest first, each with ``dir`` (relative to the run)."""
    out = []
    from .readback import real_dir_inside

    for path in sorted((run_dir / layout.TRIES).glob(f"*/{layout.TRY_RECORD}")):
        if not real_dir_inside(path.parent, run_dir):
            continue
        record = read_try(path)
        if record is not None:
            out.append(replace(record, dir=str(path.parent.relative_to(run_dir))))
    return out
