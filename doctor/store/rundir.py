"""Run directories as a whole: make one (claimed for one run: doctor.store.claim), find the
newest, write the run record (``run.json``; doctor.store.run_json reads it back), and what is
done to one after the job (compress its traces, measure it, write the outputs); and the
directory of a multi-node job: its nodes' folders, how far each has got (a folder holding an
earlier job's run is never merged with this job's), and the claim of the one node that merges
them. Every file is written through doctor.store.safe_files: a link planted at its name is
replaced, never written through.

The layout is doctor.store.layout's. The run record carries the format (``schema``).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from doctor.errors import RunDirError, UsageError
from doctor.store import layout

from .claim import claim_run_dir, clear_merged_outputs
from .run_json import RunJson, read_run_json
from .safe_files import open_new, write_text_atomic

DEFAULT_ROOT = Path("doctor-runs")
#: A node's run that ended this long before another node's run of the directory began belongs
#: to an earlier job (the nodes of one job run at the same time; the slack covers clocks that
#: differ between hosts, and the second that "started" is rounded to).
EARLIER_JOB_GAP_S = 60.0
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def new_run_dir(out: Path | None, name: str, root: Path = DEFAULT_ROOT, *,
                force: bool = False, option: str = "--force") -> Path:
    """Create and claim the run directory (``--out``, or a new ``./doctor-runs/<timestamp>-
    <name>``) for this process's run (doctor.store.claim): refused when another run records into
    it now, or when it holds an earlier run and not ``force`` (which replaces that run)."""
    try:
        if out is None:
            out = _fresh_dir(root, name)
        else:
            out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"cannot write the run directory {out or root}: "
                         f"{err.strerror or err}") from err
    claim_run_dir(out, force, option=option)
    return out.resolve()


def new_node_dir(job_dir: Path, node: int, name: str, *, force: bool = False) -> Path:
    """Create and claim node ``node``'s run directory in a multi-node job's directory: the rules
    of new_run_dir apply to the node's own folder, not to the directory the nodes share. With
    ``force``, the job directory's merged outputs of an earlier job go too."""
    if (job_dir / layout.RUN_RECORD).exists():
        raise UsageError(f"{job_dir} holds a single-node run: give every node of this job "
                         "another --out directory")
    run_dir = new_run_dir(layout.node_dir(job_dir, node), name, force=force)
    if force:
        clear_merged_outputs(job_dir)
    return run_dir


def _fresh_dir(root: Path, name: str) -> Path:
    """A new folder ``<timestamp>-<name>`` under ``root`` (made here: no other run has it)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:40] or "job"
    root.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        out = root / (f"{stamp}-{safe}" if n == 1 else f"{stamp}-{safe}-{n}")
        try:
            out.mkdir()
        except FileExistsError:
            continue
        return out
    raise FileExistsError(f"no free name for {stamp}-{safe} under {root}")


def newest_run(root: Path = DEFAULT_ROOT) -> Path:
    """The run directory under ``root`` whose record changed last: a run's own, or a multi-node
    job's directory (the newest record of its nodes counts)."""
    records = [*root.glob(f"*/{layout.RUN_RECORD}"),
               *(p for p in root.glob(f"*/{layout.NODE_GLOB}/{layout.RUN_RECORD}")
                 if layout.node_of_dir(p.parent) is not None)] if root.is_dir() else []
    if not records:
        raise RunDirError(f"no runs under ./{root}: run `doctor run train.py` first, "
                          "or name a run directory or trace file")
    newest = max(records, key=lambda p: p.stat().st_mtime).parent
    return newest if newest.parent == root else newest.parent


def write_run_record(run_dir: Path, record: dict[str, Any]) -> None:
    _write_json(run_dir / layout.RUN_RECORD, {"schema": layout.FORMAT, **record})


def gzip_traces(run_dir: Path) -> None:
    """Compress each exported trace (trace.json, trace-N.json) in place (done after the job,
    off its thread). A trace that is a link is not read (nor what it points to), and the
    compressed file replaces whatever is at its name, a link included, without writing through
    it."""
    for path in layout.uncompressed_traces(run_dir):
        try:
            fd = os.open(path, os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
        except OSError:
            continue  # a link, or gone: left as it is
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or a device: never read
            os.close(fd)
            continue
        src = os.fdopen(fd, "rb")
        try:
            with src, open_new(path.with_name(path.name + ".gz")) as raw, \
                    gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=5, filename="") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            os.unlink(path)
        except OSError:
            continue  # the trace stays uncompressed; the reader takes either


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
    write_text_atomic(run_dir / layout.VERDICT, verdict_json)
    write_text_atomic(run_dir / layout.REPORT, report_html)


def report_path(run_dir: Path) -> Path:
    return run_dir / layout.REPORT


def write_node_record(run_dir: Path, node: int, nnodes: int, done: bool) -> None:
    """Which node of how many ``run_dir`` records, and whether its own outputs are written
    (``done``: the merge waits for every node's, so that it never reads a file being written)."""
    _write_json(run_dir / layout.NODE_RECORD, {"node": node, "nnodes": nnodes, "done": done})


def write_nodes_record(job_dir: Path, record: Mapping[str, Any]) -> None:
    """What the merging node merged, beside the job's merged outputs."""
    _write_json(job_dir / layout.NODES_RECORD, record)


def _write_json(path: Path, record: Mapping[str, Any]) -> None:
    write_text_atomic(path, json.dumps(record, indent=2, default=str))


def _read_json(path: Path) -> dict[str, Any]:
    from .readback import Unreadable, read_json

    try:
        record = read_json(path)
    except Unreadable:
        return {}
    return record if isinstance(record, dict) else {}


@dataclass(frozen=True)
class JobNodes:
    """The node folders of a multi-node job's directory, and how far each one has got."""

    job_dir: Path
    nnodes: int  # the job's nodes: the most any node said, and at least every folder seen
    recorded: Mapping[int, Path]  # node -> its run directory (a folder with a run record)
    ended: frozenset[int]  # nodes whose run record has the job's exit status
    done: frozenset[int]  # ... and whose own verdict and report are written
    key: str  # names this set of node runs (a run again into the same directory is another)
    #: nodes whose folder holds an earlier job's run (it ended before this job's newest node
    #: run began): never merged with this job's, and waited for like a missing one
    earlier: frozenset[int] = frozenset()

    @property
    def dirs(self) -> list[Path]:
        """The recorded nodes' run directories, in node order."""
        return [self.recorded[k] for k in sorted(self.recorded)]

    @property
    def missing(self) -> list[int]:
        return [k for k in range(self.nnodes) if k not in self.recorded and k not in self.earlier]

    @property
    def running(self) -> list[int]:
        """Recorded nodes whose job has not ended (or was stopped before it could say so)."""
        return [k for k in sorted(self.recorded) if k not in self.ended]

    @property
    def complete(self) -> bool:
        return not self.missing and not self.earlier and len(self.done) == len(self.recorded)


def is_job_dir(path: Path) -> bool:
    """Whether ``path`` is a multi-node job's directory: no run record of its own, node folders
    with one."""
    return (path.is_dir() and not (path / layout.RUN_RECORD).is_file()
            and any((d / layout.RUN_RECORD).is_file() for _, d in layout.node_dirs(path)))


def job_nodes(job_dir: Path, nnodes: int | None = None) -> JobNodes:
    """The nodes of ``job_dir`` as they stand now (``nnodes``: the count this node knows)."""
    counts = [nnodes or 1]
    recorded: dict[int, Path] = {}
    ended, done, keys = set(), set(), {}
    spans: dict[int, tuple[float, float | None]] = {}
    for node, run_dir in layout.node_dirs(job_dir):
        mine = _read_json(run_dir / layout.NODE_RECORD)
        counts.append(mine["nnodes"] if isinstance(mine.get("nnodes"), int) else 1)
        if not (run_dir / layout.RUN_RECORD).is_file():
            continue
        recorded[node] = run_dir
        counts.append(node + 1)
        try:
            run = read_run_json(run_dir)
        except RunDirError:
            continue
        keys[node] = [node, run.host, run.started, run.t0_monotonic_s]
        span = _span(run)
        if span is not None:
            spans[node] = span
        if run.ended:
            ended.add(node)
            if mine.get("done") is True:
                done.add(node)
    newest = max((start for start, _ in spans.values()), default=0.0)
    earlier = {k for k, (_, end) in spans.items()
               if end is not None and end + EARLIER_JOB_GAP_S < newest}
    for k in earlier:
        del recorded[k], keys[k]
    key = hashlib.sha256(json.dumps([keys[k] for k in sorted(keys)], default=str).encode()
                         ).hexdigest()[:16]
    return JobNodes(job_dir, max(counts), recorded, frozenset(ended - earlier),
                    frozenset(done - earlier), key, frozenset(earlier))


def _span(run: RunJson) -> tuple[float, float | None] | None:
    """When a node's run began and ended (None: not ended), in seconds since the epoch; None
    when its record does not say."""
    try:
        start = datetime.strptime(str(run.started), "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except ValueError:
        return None
    if run.duration_s is None or not run.ended:
        return start, None
    return start, start + run.duration_s


def claim_merge(nodes: JobNodes) -> bool:
    """Claim the merge of ``nodes`` for this process: True for exactly one claimant of each set
    of node runs, across the nodes that share the directory (O_CREAT|O_EXCL, atomic on NFS)."""
    try:
        fd = os.open(layout.merge_lock(nodes.job_dir, nodes.key),
                     os.O_CREAT | os.O_EXCL | os.O_WRONLY | _NOFOLLOW, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(f"{socket.gethostname()} {os.getpid()}\n")
    return True
