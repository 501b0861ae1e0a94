"""``load_run(dirs) -> RunData``: the one reader of run directories.

Each directory is one node's ``doctor run`` (or ``doctor.watch``); several are combined into one
job. Nothing here interprets what was recorded (which process trained, where steps begin): that
is the analysis's. A ring that is not one of ours, or cannot be read, is a one-line error; a
process folder whose meta.json is missing (a process killed at birth) reads as what its files
say.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from doctor.errors import (
    RingFormatError,
    RingVersionError,
    RunFormatError,
    WindowUnavailable,
)
from doctor.store import layout
from doctor.store.data_files import read_mounts, read_scans
from doctor.store.records import EVENT_WINDOW_START, EVENT_WINDOW_STOP_BEGIN, INTERVAL_RINGS
from doctor.store.ringbuffer import VERSION as RING_VERSION
from doctor.store.ringbuffer import read_ring
from doctor.store.run_json import RunJson, read_run_json
from doctor.store.rundata import (
    FRAME_COLUMNS,
    RUN,
    RunData,
    RunRecord,
    combine,
    empty_frames,
    typed,
)
from doctor.store.samples import (
    read_gpu,
    read_gpu_info,
    read_gpu_procs,
    read_host,
    read_memory,
    read_others,
)
from doctor.store.stack_rows import stack_rows, stack_time_rows
from doctor.store.tries import read_tries
from doctor.store.windows import on_process_clock, read_window

from .meta_rows import (
    amp_rows,
    compile_cause_rows,
    ddp_rows,
    gc_totals,
    killed_children_text,
    loader_rows,
    log_totals,
    model_state_rows,
    optimizer_rows,
    overflow_rows,
    pipeline_rows,
    sharding_rows,
)
from .process_meta import ProcessMeta, read_meta
from .readback import (
    Unreadable,
    as_bool,
    as_int,
    as_str,
    printable,
    read_text,
    real_dir_inside,
    regular_file,
)
from .records import RING_PROBES
from .ringbuffer import ring_stop_reason

RING_NAMES = ("steps", *INTERVAL_RINGS, "events", "run_steps")
ERROR_LIMIT = 1 << 20  # bytes read of a bootstrap error (its first line is reported)
RING_LIMIT = 1 << 30  # bytes of a ring file read (doctor's are a few MB)


def load_run(dirs: Path | Sequence[Path]) -> RunData:
    """The run recorded in ``dirs`` (one per node of a multi-node job)."""
    paths = [dirs] if isinstance(dirs, Path) else list(dirs)
    return combine([_load_node(Path(d)) for d in paths])


def _load_node(run_dir: Path) -> RunData:
    run = read_run_json(run_dir)
    procs: list[dict[str, Any]] = []
    statuses: list[dict[str, Any]] = []
    loaders: list[dict[str, Any]] = []
    marks: list[pd.DataFrame] = []
    intervals: list[pd.DataFrame] = []
    events: list[pd.DataFrame] = []
    run_steps: list[pd.DataFrame] = []
    stacks: list[dict[str, Any]] = []
    spans: list[dict[str, Any]] = []
    later_stacks: list[dict[str, Any]] = []
    later_spans: list[dict[str, Any]] = []
    stack_times: list[dict[str, Any]] = []
    windows: list[pd.DataFrame] = []
    later: list[pd.DataFrame] = []
    window_status: list[dict[str, Any]] = []
    dirs_of: dict[int, Path] = {}
    model_states: list[dict[str, Any]] = []
    ops: list[pd.DataFrame] = []
    collectives: list[pd.DataFrame] = []
    window_events: list[pd.DataFrame] = []
    ddp: list[dict[str, Any]] = []
    sharding: list[dict[str, Any]] = []
    pipeline: list[dict[str, Any]] = []
    optimizers: list[dict[str, Any]] = []
    amp: list[dict[str, Any]] = []
    compile_causes: list[dict[str, Any]] = []
    overflows: list[dict[str, Any]] = []
    problems: list[str] = []
    for proc_dir, rank, role, pid in layout.process_dirs(run_dir):
        if not real_dir_inside(proc_dir, run_dir):
            problems.append(f"{proc_dir} is a link or leads out of the run directory: left out")
            continue
        meta = read_meta(proc_dir, problems)
        who = {"node": 0, "rank": rank, "pid": pid}
        procs.append(_process_row(who, role, proc_dir, meta))
        statuses += [{**who, "probe": name, "ok": s.ok, "reason": s.reason, "hint": s.hint}
                     for name, s in meta.probes.items()]
        model_states += model_state_rows(who, meta)
        ddp += ddp_rows(who, meta)
        sharding += sharding_rows(who, meta)
        pipeline += pipeline_rows(who, meta)
        optimizers += optimizer_rows(who, meta)
        amp += amp_rows(who, meta)
        compile_causes += compile_cause_rows(who, meta)
        overflows += overflow_rows(who, meta)
        loaders += loader_rows(who, meta)
        marks.append(_ring(proc_dir, "steps", who, problems))
        for name in INTERVAL_RINGS:
            intervals.append(_ring(proc_dir, name, who, problems).assign(name=name))
        events.append(process_events := _ring(proc_dir, "events", who, problems))
        run_steps.append(_ring(proc_dir, "run_steps", who, problems))
        statuses = _with_stopped_rings(statuses, proc_dir, who, problems)
        for n in (1, *layout.later_stacks(proc_dir)):
            rows, span = stack_rows(proc_dir, who, n, problems)
            stack_times += stack_time_rows(proc_dir, who, n, span, problems)
            if n == 1:
                stacks += rows
                spans += [span] if span is not None else []
            else:
                later_stacks += [{**r, "window": n} for r in rows]
                later_spans += [{**span, "window": n}] if span is not None else []
        trace = next((proc_dir / n for n in (layout.TRACE_GZ, layout.TRACE)
                      if os.path.lexists(proc_dir / n)), None)
        if trace is not None and not role.startswith("worker") and not regular_file(trace):
            window_status.append({**who, "ok": False,
                                  "reason": f"{trace.name} is not a regular file: not read"})
        elif trace is not None and not role.startswith("worker"):
            try:
                window = read_window(trace, rank)
                windows.append(window.steps.assign(node=0, pid=pid))
                ops.append(window.ops.assign(**who))
                collectives.append(window.calls.assign(**who))
                window_events.append(on_process_clock(
                    window.events, dict(meta.window),
                    _window_span(process_events)).assign(**who))
                window_status.append({**who, "ok": True, "reason": "",
                                      "events": window.events_total})
            except WindowUnavailable as err:
                window_status.append({**who, "ok": False, "reason": f"trace unreadable: {err}"})
        if not role.startswith("worker"):
            dirs_of[pid] = proc_dir
            later += _later_windows(proc_dir, who, problems)
    host, system = read_host(run_dir, problems)
    memory = read_memory(dirs_of, problems)
    rank_of = {p["pid"]: p["rank"] for p in procs}
    memory["rank"] = [rank_of.get(int(p), -1) for p in memory["pid"]]
    parts: dict[str, Any] = {
        "processes": procs, "probe_status": statuses, "loaders": loaders,
        "marks": _concat(marks), "intervals": _concat(intervals), "events": _concat(events),
        "stacks": stacks, "stack_spans": spans, "host": host.assign(node=0),
        "system": system.assign(node=0), "gpu": read_gpu(run_dir, problems).assign(node=0),
        "gpu_procs": read_gpu_procs(run_dir).assign(node=0),
        "memory": memory.assign(node=0), "window": _concat(windows),
        "window_status": window_status, "model_state": model_states, "ops": _concat(ops),
        "collectives": _concat(collectives), "ddp": ddp, "sharding": sharding,
        "pipeline": pipeline, "optimizers": optimizers, "amp": amp,
        "compile_causes": compile_causes, "overflows": overflows,
        "window_events": _concat(window_events), "later_windows": _concat(later),
        "later_stacks": later_stacks, "later_stack_spans": later_spans,
        "stack_times": stack_times,
        "others": read_others(run_dir, problems).assign(node=0),
        "fd_scans": read_scans(run_dir, problems).assign(node=0),
        "mounts": read_mounts(run_dir, problems).assign(node=0),
        "run_steps": _concat(run_steps),
    }
    frames = empty_frames()
    for name, rows in parts.items():
        if len(rows):
            frames[name] = typed(rows, FRAME_COLUMNS[name])
    return RunData(record=_record(run_dir, run, problems), **frames)


def _later_windows(proc_dir: Path, who: dict[str, Any], problems: list[str]
                   ) -> list[pd.DataFrame]:
    """The steps of each later window of a process (``trace-N.json[.gz]``), with N; one that
    cannot be read is left out, with a note."""
    out = []
    for n, path in layout.later_traces(proc_dir):
        if not regular_file(path):
            problems.append(f"{path} is not a regular file: left out")
            continue
        try:
            window = read_window(path, int(who["rank"]))
        except WindowUnavailable as err:
            problems.append(f"{path}: its window cannot be read ({err}): left out")
            continue
        out.append(window.steps.assign(node=0, pid=int(who["pid"]), window=n))
    return out


def _window_span(events: pd.DataFrame) -> tuple[int, int] | None:
    """(window start, stop begin) on the process's clock, from its events ring; None if absent."""
    if events.empty:
        return None
    codes, times = events["event"].to_numpy(), events["t_ns"].to_numpy()
    start, stop = times[codes == EVENT_WINDOW_START], times[codes == EVENT_WINDOW_STOP_BEGIN]
    return (int(start[0]), int(stop[0])) if len(start) and len(stop) else None


def _record(run_dir: Path, run: RunJson, problems: list[str]) -> RunRecord:
    """The run record: run.json's fields (doctor.store.run_json: one of another type is as good
    as absent), the bootstrap errors, the tries and the GPUs of the run directory."""
    errors = tuple(_first_line(p) for p in layout.bootstrap_errors(run_dir)
                   if real_dir_inside(p.parent, run_dir))
    if run.argv_fault in ("empty", "not a list"):
        problems.append(f"{run_dir / layout.RUN_RECORD}: its argv is not a list: left out")
    t0 = run.t0_monotonic_s or 0.0
    visible = (run.env or {}).get("CUDA_VISIBLE_DEVICES")
    return RunRecord(
        kind=run.mode or RUN, sources=(printable(str(run_dir)),),
        argv=tuple(printable(a) for a in run.argv), exit_code=run.exit_code,
        signal=run.signal, cores=run.cores, memory_bytes=run.memory_bytes, peaks=run.peaks,
        host=run.host, python=run.python, started=run.started, duration_s=run.duration_s,
        fd_handoff_s=run.fd_handoff_s, probes=run.probes, nodes=(run.host,),
        t0_ns={0: int(t0 * 1e9) if abs(t0) < 1e9 else 0},
        bootstrap_errors=errors, problems=tuple(problems), tries=tuple(read_tries(run_dir)),
        gpus=tuple({**g, "node": 0} for g in read_gpu_info(run_dir)),
        visible_devices=visible if isinstance(visible, str) else None,
        links=run.links, deaths=run.deaths,
    )


def _first_line(path: Path) -> str:
    try:
        return printable(read_text(path, ERROR_LIMIT).strip().splitlines()[0])
    except Unreadable as err:
        return f"its message cannot be read ({err})"
    except IndexError:
        return "no message"


def job_world_size(run_dir: Path) -> int:
    """The most ranks any process of the run says its job has (``WORLD_SIZE``), or the ranks of
    its folders if more: 1 for a job without ranks."""
    world = 1
    for proc_dir, rank, _role, _pid in layout.process_dirs(run_dir):
        size = as_int(read_meta(proc_dir).world_size)
        world = max(world, rank + 1, size if size is not None and size < 1 << 20 else 1)
    return world


def _process_row(who: dict[str, Any], role: str, proc_dir: Path, meta: ProcessMeta
                 ) -> dict[str, Any]:
    window, start, end = meta.window, meta.memory_at_start, meta.memory_at_end
    return {**who, "role": role, "path": str(proc_dir), "ppid": meta.ppid,
            "started_ns": meta.started_ns, "ended_ns": meta.ended_ns, "cores": meta.cores,
            "world_size": meta.world_size, "torch_version": meta.torch_version,
            "torch_threads": meta.torch_threads, "cuda": meta.cuda, "crashed": meta.crashed,
            "crashed_ns": meta.crashed_ns,
            "crashed_children": killed_children_text(meta.crashed_children),
            "window_state": as_str(window.get("state")),
            "window_reason": as_str(window.get("reason")),
            "window_shapes": as_bool(window.get("shapes")), "cuda_uuid": meta.cuda_uuid,
            "cuda_initialized": meta.cuda_initialized, "cuda_device": meta.cuda_device,
            "start_private_bytes": start.get("private_bytes"),
            "start_rss_bytes": start.get("rss_bytes"), "start_memory_ns": start.get("t_ns"),
            "end_private_bytes": end.get("private_bytes"), "end_rss_bytes": end.get("rss_bytes"),
            "end_memory_ns": end.get("t_ns"), **gc_totals(meta.gc),
            **log_totals(meta.logging),
            "framework": meta.framework, "framework_version": meta.framework_version}


def _ring(proc_dir: Path, name: str, who: dict[str, Any], problems: list[str]) -> pd.DataFrame:
    """One ring's records, oldest first, as a frame (empty when the process has no such ring).
    A ring of another doctor's layout stops the read (RunFormatError: the run must be recorded
    again); a damaged one (a process killed as it made it) is left out, and ``problems`` says
    so."""
    path = layout.ring_path(proc_dir, name)
    if not os.path.lexists(path):
        return pd.DataFrame()
    if not regular_file(path):
        problems.append(f"{path} is not a regular file: left out")
        return pd.DataFrame()
    if path.stat().st_size > RING_LIMIT:
        problems.append(f"{path} is over {RING_LIMIT >> 20} MB, not a ring of doctor's: left out")
        return pd.DataFrame()
    try:
        records, _written = read_ring(path)
    except RingVersionError as err:
        raise RunFormatError(
            f"{proc_dir.parent.parent} was recorded by another doctor (its rings are version "
            f"{err.version}, this doctor reads {RING_VERSION}): record the job again with this "
            "version's doctor run") from err
    except RingFormatError as err:
        problems.append(f"{err}: left out")
        return pd.DataFrame()
    except (OSError, ValueError, TypeError, struct.error) as err:  # a damaged header
        problems.append(f"{path}: not readable as a ring ({type(err).__name__}): left out")
        return pd.DataFrame()
    n = len(records)
    return pd.DataFrame({**{k: np.full(n, v, dtype=np.int64) for k, v in who.items()},
                         **{k: records[k] for k in records.dtype.names or ()}})


def _with_stopped_rings(statuses: list[dict[str, Any]], proc_dir: Path, who: dict[str, Any],
                        problems: list[str]) -> list[dict[str, Any]]:
    """The probe statuses, with each probe whose ring stopped recording (a full or failing disk,
    said in the ring's header even where meta.json could not be written) marked stopped; and a
    note for each such ring (the run's figures are partial)."""
    stopped: dict[str, list[str]] = {}
    for name in RING_NAMES:
        path = layout.ring_path(proc_dir, name)
        reason = ring_stop_reason(path) if path.is_file() else None
        if reason is None:
            continue
        stopped.setdefault(reason, []).append(name)
        probe = RING_PROBES.get(name, name)
        statuses = [s for s in statuses if not (s["pid"] == who["pid"] and s["probe"] == probe)]
        statuses.append({**who, "probe": probe, "ok": False,
                         "reason": f"stopped: {reason} ({name}.ring)",
                         "hint": "the job was not affected; make room where the run directory "
                                 "is and run again for the whole run"})
    for reason, names in stopped.items():
        rings = " and ".join(names)
        problems.append(f"the records {proc_dir.parent.name}/{proc_dir.name} made after its "
                        f"{rings} ring{'s' if len(names) > 1 else ''} stopped ({reason})")
    return statuses


def _concat(parts: list[pd.DataFrame]) -> pd.DataFrame:
    kept = [p for p in parts if not p.empty]
    return pd.concat(kept, ignore_index=True) if kept else pd.DataFrame()


__all__ = ["load_run"]

