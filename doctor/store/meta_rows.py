"""The rows a process's meta.json gives the run's frames: its DataLoaders, its model state and
activations, its DistributedDataParallel modules.

meta.json is written by the job's probes, but a run directory may be damaged or edited by hand:
its top-level fields are checked as it is read (doctor.store.process_meta), and here each field
of its nested records is taken only when it has its type (doctor.store.readback's ``as_*``); a
row whose identifying numbers are missing or of another type is left out, so that a frame's
int64 columns never meet a string, a list or a float past int64.
"""

from __future__ import annotations

from typing import Any

from .process_meta import ProcessMeta
from .readback import as_bool, as_dict, as_float, as_int, as_list, as_str


def loader_rows(who: dict[str, Any], meta: ProcessMeta) -> list[dict[str, Any]]:
    """Each DataLoader the process built (doctor.probes.dataloader), with the tensors of its
    batch."""
    counts = meta.batch_tensors
    rows = []
    for lo in meta.loaders:
        loader_id, workers = as_int(lo.get("id")), as_int(lo.get("num_workers"))
        if loader_id is None or workers is None or workers < 0:
            continue
        rows.append({
            **who, "id": loader_id, "num_workers": workers,
            "batch_size": as_int(lo.get("batch_size")),
            "batched": as_bool(lo.get("batched")),
            "loader_class": as_str(lo.get("loader_class")),
            "pin_memory": as_bool(lo.get("pin_memory")) or False,
            "prefetch_factor": as_int(lo.get("prefetch_factor")),
            "persistent_workers": as_bool(lo.get("persistent_workers")) or False,
            "dataset": as_str(lo.get("dataset")), "dataset_len": as_int(lo.get("dataset_len")),
            "collate_fn": as_str(lo.get("collate_fn")),
            "sharing_strategy": as_str(lo.get("sharing_strategy")),
            "batch_tensors": as_int(counts.get(str(loader_id)))})
    return rows


def optimizer_rows(who: dict[str, Any], meta: ProcessMeta) -> list[dict[str, Any]]:
    """Each optimizer the process stepped, as it first stepped (doctor.probes.steps): its class,
    its foreach and fused settings (None: torch's default), its parameter tensors and their
    device."""
    return [{**who, "optimizer": as_str(o.get("class")) or "?",
             "foreach": as_bool(o.get("foreach")), "fused": as_bool(o.get("fused")),
             "tensors": as_int(o.get("tensors")) or 0, "device": as_str(o.get("device")) or ""}
            for o in meta.optimizers]


def amp_rows(who: dict[str, Any], meta: ProcessMeta) -> list[dict[str, Any]]:
    """The autocasts the process entered and its GradScalers (doctor.probes.amp): kind
    "autocast" with device, dtype and enabled; kind "scaler" with its class as the dtype, its
    device, whether enabled and its settings (None: not read)."""
    rows = [{**who, "kind": "autocast", "device": as_str(a.get("device")) or "",
             "dtype": as_str(a.get("dtype")) or "", "enabled": as_bool(a.get("enabled"))}
            for a in meta.autocast]
    for s in meta.scalers:
        rows.append({**who, "kind": "scaler", "device": as_str(s.get("device")) or "",
                     "dtype": as_str(s.get("class")) or "GradScaler",
                     "enabled": as_bool(s.get("enabled")),
                     **{k: as_float(s.get(k)) for k in ("init_scale", "growth_factor",
                                                         "backoff_factor", "growth_interval")}})
    return rows


def compile_cause_rows(who: dict[str, Any], meta: ProcessMeta) -> list[dict[str, Any]]:
    """Each recompilation with the guard that failed, and each graph break with its place in
    the job's code and count (doctor.probes.compile_causes); a row without its text is left
    out."""
    causes = meta.compile_causes
    rows = []
    for kind, key in (("recompile", "recompiles"), ("break", "graph_breaks")):
        for r in as_list(causes.get(key)):
            r = as_dict(r)
            reason = as_str(r.get("reason"))
            if reason is None:
                continue
            frame, nth = as_int(r.get("frame")), as_int(r.get("nth"))
            rows.append({**who, "kind": kind, "reason": reason,
                         "frame": -1 if frame is None else frame,
                         "nth": -1 if nth is None else nth,
                         "function": as_str(r.get("function")) or "",
                         "file": as_str(r.get("file")) or "", "line": as_int(r.get("line")) or 0,
                         "count": as_int(r.get("count")) or 1})
    return rows


def overflow_rows(who: dict[str, Any], meta: ProcessMeta) -> list[dict[str, Any]]:
    """Where gradients overflowed (doctor.probes.overflow_watch): a row per period the watch was
    armed, per skipped iteration it read (the first non-finite gradient's module), and one for
    why it was not armed; a period or iteration without its numbers is left out."""
    record = meta.overflow
    empty = {"module": "", "module_class": "", "param": "", "shape": "", "then": "", "note": "",
             "forward": "", "forward_class": ""}
    rows = []
    for p in map(as_dict, as_list(record.get("periods"))):
        at, params, watched = (as_int(p.get(k)) for k in ("armed_at", "params", "watched"))
        if at is not None and params is not None:
            rows.append({**who, **empty, "kind": "period", "iteration": at, "params": params,
                         "nonfinite": 0, "watched": watched or 0})
    for it in map(as_dict, as_list(record.get("iterations"))):
        n, params, bad = (as_int(it.get(k)) for k in ("iteration", "params", "nonfinite"))
        if n is None or params is None or bad is None:
            continue
        first, forward = as_dict(it.get("first")), as_dict(it.get("forward"))
        then = [t for t in as_list(it.get("then")) if isinstance(t, str)]
        rows.append({**who, **empty, "kind": "iteration", "iteration": n, "params": params,
                     "nonfinite": bad, "watched": 0,
                     **{col: as_str(first.get(key)) or "" for col, key in (
                         ("module", "module"), ("module_class", "class"), ("param", "param"),
                         ("shape", "shape"))},
                     "then": ", ".join(then), "forward": as_str(forward.get("module")) or "",
                     "forward_class": as_str(forward.get("class")) or ""})
    note = as_str(record.get("not_armed"))
    if note:
        rows.append({**who, **empty, "kind": "not_armed", "iteration": -1, "params": 0,
                     "nonfinite": 0, "watched": 0, "note": note})
    return rows


def model_state_rows(who: dict[str, Any], meta: ProcessMeta) -> list[dict[str, Any]]:
    """The model-state probe's rows of one process (doctor.probes.model_state), with its tag;
    each optimizer's class a row of kind "optimizer" (its name as the dtype, no bytes)."""
    rows = []
    for tag, state in meta.model_state.items():
        state = as_dict(state)
        for row in as_list(state.get("rows")):
            row = as_dict(row)
            nbytes = as_int(row.get("bytes"))
            if nbytes is None or as_str(row.get("kind")) is None:
                continue
            rows.append({**who, "tag": str(tag), "kind": row["kind"],
                         "device": as_str(row.get("device")), "dtype": as_str(row.get("dtype")),
                         "bytes": nbytes, "tensors": as_int(row.get("tensors")) or 0})
        rows += [{**who, "tag": str(tag), "kind": "optimizer", "device": "", "dtype": str(name),
                  "bytes": 0, "tensors": 0} for name in as_list(state.get("optimizers"))]
    return rows + activation_rows(who, meta.saved_tensors)


def activation_rows(who: dict[str, Any], saved: Any) -> list[dict[str, Any]]:
    """The bytes saved for backward (doctor.probes.saved_tensors): kind "activations", one row
    per window step (tag "window_step", dtype "all"), and per device and dtype the mean of a
    step (tag "window", device and dtype from "cuda:float32")."""
    saved = as_dict(saved)
    steps = [(b, n) for s in as_list(saved.get("steps")) if isinstance(s, list) and len(s) == 2
             and (b := as_int(s[0])) is not None and (n := as_int(s[1])) is not None]
    rows = [{**who, "tag": "window_step", "kind": "activations", "device": "all",
             "dtype": "all", "bytes": b, "tensors": n} for b, n in steps]
    for key, nbytes in (as_dict(saved.get("dtypes")).items() if steps else ()):
        if as_int(nbytes) is None:
            continue
        device, _, dtype = str(key).rpartition(":")
        rows.append({**who, "tag": "window", "kind": "activations", "device": device or "all",
                     "dtype": dtype, "bytes": int(nbytes) // len(steps), "tensors": 0})
    return rows


def ddp_rows(who: dict[str, Any], meta: ProcessMeta) -> list[dict[str, Any]]:
    """Each DistributedDataParallel the process built (doctor.probes.ddp): bucket bytes summed,
    the last bucket's (reduced when backward ends: never overlapped), seconds from DDP's
    nanoseconds."""
    rows = []
    for d in meta.ddp:
        sizes = [b for b in map(as_float, as_list(d.get("bucket_bytes"))) if b is not None]
        rows.append({
            **who, "bucket_cap_bytes": as_float(d.get("bucket_cap_bytes")),
            "buckets": len(sizes), "bucket_bytes": sum(sizes) if sizes else None,
            "last_bucket_bytes": sizes[-1] if sizes else None,
            "parameter_bytes": as_float(d.get("parameter_bytes")),
            "dtypes": ",".join(str(t) for t in as_list(d.get("dtypes"))),
            "backend": as_str(d.get("backend")), "world_size": as_int(d.get("world_size")) or 0,
            **{f"backward_{k}_s": _seconds(d.get(f"backward_{k}_ns"))
               for k in ("compute", "comm", "overlap")},
            **{k: d.get(k) is True for k in ("gradient_as_bucket_view", "static_graph",
                                             "find_unused_parameters")},
        })
    return rows


def sharding_rows(who: dict[str, Any], meta: ProcessMeta) -> list[dict[str, Any]]:
    """The process's sharded modules (doctor.probes.sharding): one row per API it used."""
    rows = []
    for api, d in meta.sharding.items():
        record = as_dict(d)
        units = as_int(record.get("units"))
        if not units:
            continue
        reshard = as_list(record.get("reshard_after_forward"))
        sizes = [b for b in map(as_float, as_list(record.get("unit_bytes"))) if b is not None]
        rows.append({
            **who, "api": str(api), "units": units,
            "reshard_after_forward": ",".join(str(r) for r in reshard) if reshard else None,
            "mesh_size": as_int(record.get("mesh_size")) or 0,
            "unit_bytes": sum(sizes) if sizes else None,
            **{k: None if record.get(k) is None else str(record.get(k))
               for k in ("sharding_strategy", "forward_prefetch", "backward_prefetch",
                         "settings")},
            "config": _settings(record.get("config")) or None,
        })
    return rows


def _settings(value: Any) -> dict[str, bool | int | float | str]:
    """A recorded settings object (DeepSpeed's config): its plain values, nothing else."""
    return {str(k): v for k, v in as_dict(value).items()
            if isinstance(v, bool | int | float | str)}


def pipeline_rows(who: dict[str, Any], meta: ProcessMeta) -> list[dict[str, Any]]:
    """The process's pipeline schedules (doctor.probes.pipelining): one row each, as built."""
    rows = []
    for d in as_list(as_dict(meta.pipeline).get("schedules")):
        record = as_dict(d)
        name = as_str(record.get("schedule"))
        if not name:
            continue
        indices = [i for i in map(as_int, as_list(record.get("stages"))) if i is not None]
        rows.append({**who, "schedule": name,
                     "microbatches": as_int(record.get("n_microbatches")) or 0,
                     "stages": as_int(record.get("num_stages")) or 0,
                     "stage_indices": ",".join(str(i) for i in indices),
                     "stage_bytes": as_float(record.get("stage_bytes"))})
    return rows


def _seconds(ns: Any) -> float | None:
    value = as_float(ns)
    return value * 1e-9 if value is not None and value > 0 else None


def gc_totals(gc: Any) -> dict[str, float | None]:
    """The garbage collector's counts of a process (doctor.probes.gc_pauses, meta.json ``gc``):
    its collections, its full (generation 2) ones, their total pause and the longest pause in
    seconds; None each where it did not say (an older doctor, a process that never closed) or
    said it otherwise."""
    record = as_dict(gc)
    counts = [as_int(c) for c in as_list(record.get("collections"))]
    pauses = [as_float(p) for p in as_list(record.get("pause_ns"))]
    known = [c for c in counts if c is not None and c >= 0]
    paused = [p for p in pauses if p is not None and p >= 0]
    longest = as_float(record.get("longest_ns"))
    if not known or len(known) != len(counts) or len(paused) != len(counts):
        return {"gc_collections": None, "gc_full": None, "gc_pause_s": None,
                "gc_longest_s": None}
    return {"gc_collections": float(sum(known)),
            "gc_full": float(known[2] if len(known) > 2 else 0),
            "gc_pause_s": sum(paused) * 1e-9,
            "gc_longest_s": longest * 1e-9 if longest is not None and longest >= 0 else None}


def killed_children_text(children: Any) -> str | None:
    """The children an uncaught exception was about that a signal killed
    (doctor.record.killed_children) as "PID:SIGNAL" pairs, space-separated; None for none."""
    pairs = []
    for child in children if isinstance(children, (list, tuple)) else ():
        pid, sig = as_int(as_dict(child).get("pid")), as_int(as_dict(child).get("signal"))
        if pid is not None and pid > 0 and sig is not None and 0 < sig < 128:
            pairs.append(f"{pid}:{sig}")
    return " ".join(pairs) or None


def log_totals(logging: Any) -> dict[str, float | str | None]:
    """A process's logging calls (doctor.probes.logging_calls, meta.json ``logging``): how many,
    their time in seconds, and the libraries that made them ("logging, tensorboard"); None each
    where it did not say (no call, an older doctor, a process that never closed)."""
    record = as_dict(logging)
    kinds = [k for k in as_list(record.get("kinds")) if isinstance(k, str)]
    calls = [as_int(c) for c in as_list(record.get("calls"))]
    took = [as_float(t) for t in as_list(record.get("took_ns"))]
    if not kinds or len(calls) != len(kinds) or len(took) != len(kinds) or \
            any(c is None or c < 0 for c in calls) or any(t is None or t < 0 for t in took):
        return {"log_calls": None, "log_s": None, "log_libraries": None}
    return {"log_calls": float(sum(c or 0 for c in calls)),
            "log_s": sum(t or 0.0 for t in took) * 1e-9,
            "log_libraries": ", ".join(k for k, c in zip(kinds, calls, strict=True) if c)}
