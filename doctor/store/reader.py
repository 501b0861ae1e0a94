"""``load_run(dirs) -> RunData``: the one reader of run directories.

Each directory is one node's ``doctor run`` (or ``doctor.watch``); several are combined into one
job. Nothing here interprets what was recorded (which process trained, where steps begin): that
is the analysis's. A ring that is not one of ours, or cannot be read, is a one-line error; a
process folder whose meta.json is missing (a process killed at birth) reads as what its files
say.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from doctor.errors import (
    RingFormatError,
    RingVersionError,
    RunDirError,
    RunFormatError,
    WindowUnavailable,
)
from doctor.store import layout
from doctor.store.records import EVENT_WINDOW_START, EVENT_WINDOW_STOP_BEGIN, INTERVAL_RINGS
from doctor.store.ringbuffer import VERSION as RING_VERSION
from doctor.store.ringbuffer import read_ring
from doctor.store.rundata import (
    FRAME_COLUMNS,
    RUN,
    RunData,
    RunRecord,
    combine,
    empty_frames,
    typed,
)
from doctor.store.rundir import read_run_record
from doctor.store.samples import read_gpu, read_gpu_info, read_gpu_procs, read_host, read_memory
from doctor.store.stacks import DEFAULT_RATE_HZ, read_stacks, read_stacks_meta
from doctor.store.tries import read_tries
from doctor.store.windows import on_process_clock, read_window
from doctor.verdict import ProbeStatus

from .records import RING_PROBES
from .ringbuffer import ring_stop_reason

RING_NAMES = ("steps", *INTERVAL_RINGS, "events")


def load_run(dirs: Path | Sequence[Path]) -> RunData:
    """The run recorded in ``dirs`` (one per node of a multi-node job)."""
    paths = [dirs] if isinstance(dirs, Path) else list(dirs)
    return combine([_load_node(Path(d)) for d in paths])


def _load_node(run_dir: Path) -> RunData:
    raw = read_run_record(run_dir)
    procs: list[dict[str, Any]] = []
    statuses: list[dict[str, Any]] = []
    loaders: list[dict[str, Any]] = []
    marks: list[pd.DataFrame] = []
    intervals: list[pd.DataFrame] = []
    events: list[pd.DataFrame] = []
    stacks: list[dict[str, Any]] = []
    spans: list[dict[str, Any]] = []
    windows: list[pd.DataFrame] = []
    window_status: list[dict[str, Any]] = []
    dirs_of: dict[int, Path] = {}
    model_states: list[dict[str, Any]] = []
    ops: list[pd.DataFrame] = []
    collectives: list[pd.DataFrame] = []
    window_events: list[pd.DataFrame] = []
    ddp: list[dict[str, Any]] = []
    problems: list[str] = []
    for proc_dir, rank, role, pid in layout.process_dirs(run_dir):
        meta = _meta(proc_dir)
        who = {"node": 0, "rank": rank, "pid": pid}
        procs.append(_process_row(who, role, proc_dir, meta))
        statuses += [{**who, "probe": name, "ok": bool(s.get("ok")),
                      "reason": s.get("reason", ""), "hint": s.get("hint", "")}
                     for name, s in (meta.get("probes") or {}).items() if isinstance(s, dict)]
        model_states += _model_state_rows(who, meta)
        ddp += _ddp_rows(who, meta)
        counts = meta.get("batch_tensors") or {}
        loaders += [{**who, **lo, "batch_tensors": counts.get(str(lo.get("id")))}
                    for lo in meta.get("loaders") or []]
        marks.append(_ring(proc_dir, "steps", who, problems))
        for name in INTERVAL_RINGS:
            intervals.append(_ring(proc_dir, name, who, problems).assign(name=name))
        events.append(process_events := _ring(proc_dir, "events", who, problems))
        statuses = _with_stopped_rings(statuses, proc_dir, who, problems)
        taken = read_stacks_meta(proc_dir)
        samples = read_stacks(proc_dir, taken) if taken is not None else None
        if samples is not None:
            stacks += [{**who, "stack": s, "count": n} for s, n in samples.stacks.items()]
        if taken is not None:
            spans.append({**who, "recorder": str(taken.get("recorder", "?")),
                          "rate_hz": float(taken.get("rate_hz", DEFAULT_RATE_HZ)),
                          "start_ns": _int(taken.get("start_ns")),
                          "end_ns": _int(taken.get("end_ns")), "taken": _int(taken.get("taken"))})
        trace = layout.trace_of(proc_dir)
        if trace is not None and not role.startswith("worker"):
            try:
                window = read_window(trace, rank)
                windows.append(window.steps.assign(node=0, pid=pid))
                ops.append(window.ops.assign(**who))
                collectives.append(window.calls.assign(**who))
                window_events.append(on_process_clock(
                    window.events, meta.get("window") or {},
                    _window_span(process_events)).assign(**who))
                window_status.append({**who, "ok": True, "reason": "",
                                      "events": window.events_total})
            except WindowUnavailable as err:
                window_status.append({**who, "ok": False, "reason": f"trace unreadable: {err}"})
        if not role.startswith("worker"):
            dirs_of[pid] = proc_dir
    host, system = read_host(run_dir)
    memory = read_memory(dirs_of)
    rank_of = {p["pid"]: p["rank"] for p in procs}
    memory["rank"] = [rank_of.get(int(p), -1) for p in memory["pid"]]
    parts: dict[str, Any] = {
        "processes": procs, "probe_status": statuses, "loaders": loaders,
        "marks": _concat(marks), "intervals": _concat(intervals), "events": _concat(events),
        "stacks": stacks, "stack_spans": spans, "host": host.assign(node=0),
        "system": system.assign(node=0), "gpu": read_gpu(run_dir).assign(node=0),
        "gpu_procs": read_gpu_procs(run_dir).assign(node=0),
        "memory": memory.assign(node=0), "window": _concat(windows),
        "window_status": window_status, "model_state": model_states, "ops": _concat(ops),
        "collectives": _concat(collectives), "ddp": ddp,
        "window_events": _concat(window_events),
    }
    frames = empty_frames()
    for name, rows in parts.items():
        if len(rows):
            frames[name] = typed(rows, FRAME_COLUMNS[name])
    return RunData(record=_record(run_dir, raw, problems), **frames)


def _window_span(events: pd.DataFrame) -> tuple[int, int] | None:
    """(window start, stop begin) on the process's clock, from its events ring; None if absent."""
    if events.empty:
        return None
    codes, times = events["event"].to_numpy(), events["t_ns"].to_numpy()
    start, stop = times[codes == EVENT_WINDOW_START], times[codes == EVENT_WINDOW_STOP_BEGIN]
    return (int(start[0]), int(stop[0])) if len(start) and len(stop) else None


def _record(run_dir: Path, raw: dict[str, Any], problems: list[str]) -> RunRecord:
    errors = tuple(_first_line(p) for p in layout.bootstrap_errors(run_dir))
    probes = {str(k): ProbeStatus(bool(v.get("ok")), str(v.get("reason", "")),
                                  str(v.get("hint", "")))
              for k, v in (raw.get("probes") or {}).items() if isinstance(v, dict)}
    return RunRecord(
        kind=str(raw.get("mode") or RUN), source=str(run_dir),
        argv=tuple(str(a) for a in raw.get("argv") or ()),
        exit_code=raw.get("exit_code"), signal=raw.get("signal"),
        cores=int(raw["cores"]) if raw.get("cores") else None,
        memory_bytes=int(raw["memory_bytes"]) if raw.get("memory_bytes") else None,
        peaks=raw["peaks"] if isinstance(raw.get("peaks"), dict) else None,
        host=raw.get("host"), python=raw.get("python"), started=raw.get("started"),
        duration_s=raw.get("duration_s"), fd_handoff_s=raw.get("fd_handoff_s"), probes=probes,
        nodes=(raw.get("host"),),
        t0_ns={0: int(float(raw.get("t0_monotonic_s", 0.0)) * 1e9)},
        bootstrap_errors=errors, problems=tuple(problems), tries=tuple(read_tries(run_dir)),
        gpus=tuple({**g, "node": 0} for g in read_gpu_info(run_dir)),
        visible_devices=(raw.get("env") or {}).get("CUDA_VISIBLE_DEVICES"),
        links=raw.get("links") if isinstance(raw.get("links"), dict) else None,
        deaths=tuple(d for d in raw.get("deaths") or () if isinstance(d, dict))
        if isinstance(raw.get("deaths"), list) else (),
    )


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _first_line(path: Path) -> str:
    try:
        return path.read_text().strip().splitlines()[0]
    except (OSError, IndexError):
        return "no message"


def job_world_size(run_dir: Path) -> int:
    """The most ranks any process of the run says its job has (``WORLD_SIZE``), or the ranks of
    its folders if more: 1 for a job without ranks."""
    world = 1
    for proc_dir, rank, _role, _pid in layout.process_dirs(run_dir):
        size = _meta(proc_dir).get("world_size")
        world = max(world, rank + 1, size if isinstance(size, int) else 1)
    return world


def _meta(proc_dir: Path) -> dict[str, Any]:
    try:
        meta = json.loads((proc_dir / layout.META).read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _model_state_rows(who: dict[str, Any], meta: dict[str, Any]) -> list[dict[str, Any]]:
    """The model-state probe's rows of one process (doctor.probes.model_state), with its tag;
    each optimizer's class a row of kind "optimizer" (its name as the dtype, no bytes)."""
    states = meta.get("model_state")
    states = states if isinstance(states, dict) else {}
    rows = [{**who, "tag": tag, **row} for tag, state in states.items() if isinstance(state, dict)
            for row in state.get("rows") or () if isinstance(row, dict)]
    rows += [{**who, "tag": tag, "kind": "optimizer", "device": "", "dtype": str(name),
              "bytes": 0, "tensors": 0} for tag, state in states.items()
             if isinstance(state, dict) for name in state.get("optimizers") or ()]
    return rows + _activation_rows(who, meta.get("saved_tensors"))


def _ddp_rows(who: dict[str, Any], meta: dict[str, Any]) -> list[dict[str, Any]]:
    """Each DistributedDataParallel the process built (doctor.probes.ddp): bucket bytes summed,
    the last bucket's (reduced when backward ends: never overlapped), seconds from DDP's
    nanoseconds."""
    rows = []
    for d in meta.get("ddp") or ():
        if not isinstance(d, dict):
            continue
        sizes = [float(b) for b in d.get("bucket_bytes") or () if isinstance(b, int | float)]
        rows.append({
            **who, "bucket_cap_bytes": d.get("bucket_cap_bytes"), "buckets": len(sizes),
            "bucket_bytes": sum(sizes) if sizes else None,
            "last_bucket_bytes": sizes[-1] if sizes else None,
            "parameter_bytes": d.get("parameter_bytes"),
            "dtypes": ",".join(str(t) for t in d.get("dtypes") or ()),
            "backend": d.get("backend"), "world_size": d.get("world_size"),
            **{f"backward_{k}_s": _seconds(d.get(f"backward_{k}_ns"))
               for k in ("compute", "comm", "overlap")},
            **{k: bool(d.get(k)) for k in ("gradient_as_bucket_view", "static_graph",
                                           "find_unused_parameters")},
        })
    return rows


def _seconds(ns: Any) -> float | None:
    return float(ns) * 1e-9 if isinstance(ns, int | float) and ns > 0 else None


def _activation_rows(who: dict[str, Any], saved: Any) -> list[dict[str, Any]]:
    """The bytes saved for backward (doctor.probes.saved_tensors): kind "activations", one row
    per window step (tag "window_step", dtype "all"), and per device and dtype the mean of a
    step (tag "window", device and dtype from "cuda:float32")."""
    if not isinstance(saved, dict):
        return []
    steps = [s for s in saved.get("steps") or () if isinstance(s, list) and len(s) == 2]
    rows = [{**who, "tag": "window_step", "kind": "activations", "device": "all",
             "dtype": "all", "bytes": int(b), "tensors": int(n)} for b, n in steps]
    dtypes = saved.get("dtypes")
    for key, nbytes in (dtypes.items() if isinstance(dtypes, dict) and steps else ()):
        device, _, dtype = str(key).rpartition(":")
        rows.append({**who, "tag": "window", "kind": "activations", "device": device or "all",
                     "dtype": dtype, "bytes": int(nbytes) // len(steps), "tensors": 0})
    return rows


def _process_row(who: dict[str, Any], role: str, proc_dir: Path, meta: dict[str, Any]
                 ) -> dict[str, Any]:
    window = meta.get("window")
    window = window if isinstance(window, dict) else {}
    start, end = (m if isinstance(m := meta.get(key), dict) else {}
                  for key in ("memory_at_start", "memory_at_end"))
    return {**who, "role": role, "path": str(proc_dir), "ppid": meta.get("ppid"),
            "started_ns": meta.get("started_ns"), "ended_ns": meta.get("ended_ns"),
            "cores": meta.get("cores"), "world_size": meta.get("world_size"),
            "torch_version": meta.get("torch_version"), "torch_threads": meta.get("torch_threads"),
            "cuda": meta.get("cuda"), "crashed": meta.get("crashed"),
            "crashed_ns": meta.get("crashed_ns"), "window_state": window.get("state"),
            "window_reason": window.get("reason"), "window_shapes": window.get("shapes"),
            "cuda_uuid": meta.get("cuda_uuid"),
            "cuda_initialized": meta.get("cuda_initialized"),
            "cuda_device": meta.get("cuda_device"),
            "start_private_bytes": start.get("private_bytes"),
            "start_rss_bytes": start.get("rss_bytes"), "start_memory_ns": start.get("t_ns"),
            "end_private_bytes": end.get("private_bytes"), "end_rss_bytes": end.get("rss_bytes"),
            "end_memory_ns": end.get("t_ns")}


def _ring(proc_dir: Path, name: str, who: dict[str, Any], problems: list[str]) -> pd.DataFrame:
    """One ring's records, oldest first, as a frame (empty when the process has no such ring).
    A ring of another doctor's layout stops the read (RunFormatError: the run must be recorded
    again); a damaged one (a process killed as it made it) is left out, and ``problems`` says
    so."""
    path = layout.ring_path(proc_dir, name)
    if not path.is_file():
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
    except OSError as err:
        raise RunDirError(f"{path} is unreadable: {err.strerror or err}") from err
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
