"""A process folder's meta.json read back (``read_meta(proc_dir) -> ProcessMeta``), for the
analysis (doctor.store.reader, doctor.store.meta_rows), doctor try (doctor.store.tries) and the
progress line (doctor.progress).

The job's Session writes it (doctor.record.session ``update_meta``, from the bootstrap, the
recorder and the probes), whole each time something is added, so a process killed as it ran
leaves the last whole one. A run directory may be damaged or edited by hand: it is read through
doctor.store.readback (a regular file of its own, bounded, a JSON object), and each top-level
field is taken only when it has its type (a field of another type is as good as absent). The
fields of the nested records (a loader's settings, the model state's rows, the window's record)
are checked by their readers (doctor.store.meta_rows, doctor.store.windows).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from doctor.store import layout
from doctor.verdict import ProbeStatus

from .readback import Unreadable, as_bool, as_dict, as_int, as_list, as_str, read_json_dict
from .run_json import probe_statuses

Number = int | float  # as JSON gave it (never a bool)


@dataclass(frozen=True)
class ProcessMeta:
    """What one process of the job said of itself: each key the job writes, with its type (a
    key it has not written, or of another type: None, or empty). Times are the process's clock
    (``*_ns``: the Session's, as its rings)."""

    # the Session, when the process folder is made (doctor.record.session, process_facts)
    pid: int | None = None
    ppid: Number | None = None
    rank: int | None = None
    role: str | None = None
    argv: tuple[str, ...] = ()  # secrets hidden (doctor.store.redact)
    local_rank: int | None = None
    world_size: Number | None = None  # WORLD_SIZE
    host: str | None = None
    started_ns: Number | None = None
    cores: Number | None = None
    probes: Mapping[str, ProbeStatus] = field(default_factory=dict)  # each in-process probe's
    torch_version: str | None = None  # torch's facts, where the process imported torch
    torch_threads: Number | None = None
    cuda: bool | None = None  # torch.cuda.is_available()
    # the framework that stepped its optimizer (doctor.record.process_facts.framework_facts)
    framework: str | None = None
    framework_version: str | None = None
    # the Session, as the process ends: its CUDA device (process_facts.cuda_device), its rings
    ended_ns: Number | None = None
    rings: Mapping[str, Any] = field(default_factory=dict)  # ring name -> records written
    cuda_initialized: bool | None = None
    cuda_device: Number | None = None
    cuda_uuid: str | None = None
    stopped: Mapping[str, Any] = field(default_factory=dict)  # file -> why it records no more
    # the bootstrap: the job's uncaught exception, a probe that could not start
    crashed: str | None = None
    crashed_ns: Number | None = None
    # the child processes (DataLoader workers) that exception was about, killed by a signal
    # (doctor.record.killed_children): [{"pid": P, "signal": S}]
    crashed_children: tuple[Mapping[str, Any], ...] = ()
    probe_error: str | None = None
    # the probes: DataLoaders (doctor.probes.dataloader, the recorder), the profiler window
    # (doctor.probes.torch_ops), DDP (doctor.probes.ddp), the model state and activations
    # (doctor.probes.model_state), a worker's memory as it starts and ends
    loaders: tuple[Mapping[str, Any], ...] = ()
    batch_tensors: Mapping[str, Any] = field(default_factory=dict)  # loader id -> tensors
    window: Mapping[str, Any] = field(default_factory=dict)
    ddp: tuple[Mapping[str, Any], ...] = ()
    sharding: Mapping[str, Any] = field(default_factory=dict)  # FSDP (probes/sharding.py)
    pipeline: Mapping[str, Any] = field(default_factory=dict)  # probes/pipelining.py
    optimizers: tuple[Mapping[str, Any], ...] = ()  # each as it first stepped (probes/steps.py)
    autocast: tuple[Mapping[str, Any], ...] = ()  # each autocast entered (probes/amp.py)
    scalers: tuple[Mapping[str, Any], ...] = ()  # each GradScaler as it first updated
    # why torch.compile compiled again, where it broke the graph (probes/compile_causes.py)
    compile_causes: Mapping[str, Any] = field(default_factory=dict)
    # where gradients of skipped iterations overflowed (probes/overflow_watch.py)
    overflow: Mapping[str, Any] = field(default_factory=dict)
    model_state: Mapping[str, Any] = field(default_factory=dict)  # tag -> rows, optimizers
    saved_tensors: Mapping[str, Any] = field(default_factory=dict)
    memory_at_start: Mapping[str, Any] = field(default_factory=dict)
    memory_at_end: Mapping[str, Any] = field(default_factory=dict)
    gc: Mapping[str, Any] = field(default_factory=dict)  # the collector's counts (probes.gc)
    logging: Mapping[str, Any] = field(default_factory=dict)  # logging calls (logging_calls)
    # doctor try (doctor.record.overrides, doctor.record.stop)
    tried: Mapping[str, Any] = field(default_factory=dict)  # setting -> what was applied
    tried_errors: tuple[str, ...] = ()
    stopped_at_step: int | None = None
    stopped_ns: Number | None = None

    @classmethod
    def from_dict(cls, meta: Mapping[str, Any]) -> ProcessMeta:
        """``meta`` (a meta.json's object), each field taken when it has its type."""
        def number(key: str) -> Number | None:
            return _number(meta.get(key))

        def text(key: str) -> str | None:
            return as_str(meta.get(key))

        def record(key: str) -> dict[str, Any]:
            return as_dict(meta.get(key))

        return cls(
            pid=as_int(meta.get("pid")), ppid=number("ppid"), rank=as_int(meta.get("rank")),
            role=text("role"), argv=tuple(str(a) for a in as_list(meta.get("argv"))),
            local_rank=as_int(meta.get("local_rank")), world_size=number("world_size"),
            host=text("host"), started_ns=number("started_ns"), cores=number("cores"),
            probes=probe_statuses(meta.get("probes")), torch_version=text("torch_version"),
            torch_threads=number("torch_threads"), cuda=as_bool(meta.get("cuda")),
            framework=text("framework"), framework_version=text("framework_version"),
            ended_ns=number("ended_ns"), rings=record("rings"),
            cuda_initialized=as_bool(meta.get("cuda_initialized")),
            cuda_device=number("cuda_device"), cuda_uuid=text("cuda_uuid"),
            stopped=record("stopped"), crashed=text("crashed"), crashed_ns=number("crashed_ns"),
            crashed_children=_records(meta.get("crashed_children")),
            probe_error=text("probe_error"), loaders=_records(meta.get("loaders")),
            batch_tensors=record("batch_tensors"), window=record("window"),
            ddp=_records(meta.get("ddp")), sharding=record("sharding"), pipeline=record("pipeline"),
            optimizers=_records(meta.get("optimizers")),
            autocast=_records(meta.get("autocast")), scalers=_records(meta.get("scalers")),
            compile_causes=record("compile_causes"), overflow=record("overflow"),
            model_state=record("model_state"),
            saved_tensors=record("saved_tensors"), memory_at_start=record("memory_at_start"),
            memory_at_end=record("memory_at_end"), gc=record("gc"), logging=record("logging"),
            tried=record("tried"),
            tried_errors=tuple(e for e in as_list(meta.get("tried_errors"))
                               if isinstance(e, str)),
            stopped_at_step=as_int(meta.get("stopped_at_step")), stopped_ns=number("stopped_ns"))


def _number(value: Any) -> Number | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _records(value: Any) -> tuple[Mapping[str, Any], ...]:
    return tuple(v for v in as_list(value) if isinstance(v, dict))


def read_meta(proc_dir: Path, problems: list[str] | None = None) -> ProcessMeta:
    """A process folder's meta.json; empty when it has none (a process killed at birth) or it
    cannot be read (said in ``problems``: what the process was is then unknown)."""
    path = proc_dir / layout.META
    if not os.path.lexists(path):
        return ProcessMeta()
    try:
        return ProcessMeta.from_dict(read_json_dict(path))
    except Unreadable as err:
        if problems is not None:
            problems.append(f"{err}: left out")
        return ProcessMeta()
