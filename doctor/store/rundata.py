"""RunData: everything one run recorded, as typed frames, read once and never changed.

A run directory (doctor.store.reader.load_run) and torch.profiler traces analysed on their own
(doctor.store.traces.load_traces) load into the same record, so the analysis is one function of
it. Times are nanoseconds on each node's monotonic clock (``*_ns``: int64 from the rings,
float64 from meta.json, where they may be missing) or seconds from the node's run start
(``*_s``); every frame has a ``node`` column (the index of the run
directory it came from; several nodes of one job are combined into one RunData) and an empty
frame still has every column.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from doctor.store.data_files import MOUNT_NUMBERS, MOUNT_TEXT, SCAN_COLUMNS
from doctor.store.process_rows import Process, split_by
from doctor.store.samples import (
    GPU_COLUMNS,
    GPU_PROC_COLUMNS,
    MEMORY_COLUMNS,
    OTHER_COLUMNS,
    PROC_COLUMNS,
    SYSTEM_COLUMNS,
)
from doctor.store.try_record import TryRecord
from doctor.trace.steps import STEP_COLUMNS
from doctor.verdict import ProbeStatus

RUN, WATCH, TRACE = "run", "watch", "trace"  # what recorded it: doctor run, doctor.watch, a trace


def columns(spec: str) -> dict[str, str]:
    """Column names and dtypes from ``"a b:int64 c:object"``: each name takes the dtype that
    follows it (so ``a`` and ``b`` are int64)."""
    out: dict[str, str] = {}
    pending: list[str] = []
    for word in spec.split():
        name, _, dtype = word.partition(":")
        pending.append(name)
        if dtype:
            out.update(dict.fromkeys(pending, dtype))
            pending = []
    assert not pending, f"no dtype for {pending}"
    return out


#: Columns of each frame and their dtypes ("object" for text and tuples). Every row of the
#: process frames says which process wrote it: node, rank, pid.
WHO = "node rank pid:int64"
PROCESS_COLUMNS = columns(
    f"{WHO} role path:object ppid started_ns ended_ns cores world_size:float64 "
    "torch_version:object torch_threads:float64 cuda crashed:object crashed_ns:float64 "
    "crashed_children:object "
    "window_state window_reason window_shapes cuda_initialized cuda_uuid:object cuda_device "
    "start_private_bytes start_rss_bytes start_memory_ns end_private_bytes end_rss_bytes "
    "end_memory_ns:float64 device_name:object gc_collections gc_full gc_pause_s "
    "gc_longest_s:float64 "
    "framework framework_version:object log_calls log_s:float64 log_libraries:object")
PROBE_STATUS_COLUMNS = columns(f"{WHO} probe:object ok:bool reason hint:object")
LOADER_COLUMNS = columns(
    f"{WHO} id num_workers:int64 batch_size:object pin_memory:bool prefetch_factor:object "
    "persistent_workers:bool dataset dataset_len collate_fn sharing_strategy "
    "batch_tensors batched loader_class:object")
MARK_COLUMNS = columns(f"{WHO} t_ns kind key:int64")
INTERVAL_COLUMNS = columns(f"{WHO} name:object t0_ns t1_ns key:int64")
EVENT_COLUMNS = columns(f"{WHO} t_ns event value:int64")
#: ``thread``: "main" (the process's main thread) or "producer" (threads feeding it a queue)
STACK_COLUMNS = columns(f"{WHO} stack:object count:int64 thread:object")
RUN_STEPS_COLUMNS = columns(f"{WHO} t0_ns t1_ns steps kind min_ns max_ns max_t_ns:int64")
#: The main thread's stack samples on the time axis (doctor.store.stack_times): one row per run
#: of identical samples, on the shared clock, beside the window-th window.
STACK_TIME_COLUMNS = columns(f"{WHO} t0_ns t1_ns:int64 stack:object window:int64")
STACK_SPAN_COLUMNS = columns(f"{WHO} recorder:object rate_hz:float64 start_ns end_ns taken:int64 "
                             "busy_threads threads:float64")
WINDOW_STATUS_COLUMNS = columns(f"{WHO} ok:bool reason:object events:int64")
MODEL_STATE_COLUMNS = columns(f"{WHO} tag kind device dtype:object bytes tensors:int64")
OPTIMIZER_COLUMNS = columns(f"{WHO} optimizer foreach fused:object tensors:int64 device:object")
#: Mixed precision as each process ran it (doctor.probes.amp): one row per autocast (device,
#: dtype, enabled) entered and per GradScaler (kind "scaler": its class as the dtype, its
#: settings as it first updated).
AMP_COLUMNS = columns(f"{WHO} kind device dtype enabled:object init_scale growth_factor "
                      "backoff_factor growth_interval:float64")
#: Why torch.compile compiled again and where it broke the graph (doctor.probes.compile_causes):
#: kind "recompile" (one row each: the frame, which compilation of it or -1, the guard that
#: failed, the function's file and first line) and kind "break" (one row per reason and place in
#: the job's code, with the times Dynamo met it while tracing).
COMPILE_CAUSE_COLUMNS = columns(f"{WHO} kind:object frame nth:int64 reason function file:object "
                                "line count:int64")
#: Where gradients overflowed (doctor.probes.overflow_watch): kind "period" (each time the watch
#: was armed: the iteration it was armed at, the parameters watched, the iterations watched),
#: kind "iteration" (each skipped iteration read: its number from 0, the gradients flagged, the
#: non-finite ones, the first one's module path, class, parameter name and shape, the modules
#: that followed in backward order, comma-separated; the first module whose forward output was
#: inf or NaN and its class, "" for none) and kind "not_armed" (why, as the note).
OVERFLOW_COLUMNS = columns(f"{WHO} kind:object iteration params nonfinite watched:int64 "
                           "module module_class param shape then forward forward_class note:object")
#: The ops of each process's profiler window (doctor.trace.ops.OP_COLUMNS).
OPS_COLUMNS = columns(f"{WHO} op kind dtype:object calls:int64 self_s device_s:float64 "
                      "kernels:int64 flops bytes:float64 costed_calls:int64 layout_s:float64 "
                      "nchw_calls nhwc_calls:int64 opt_self_s opt_device_s:float64 "
                      "region:object compiled_self_s compiled_device_s:float64")
#: The collectives of each process's profiler window (doctor.trace.comm_calls.CALL_COLUMNS).
COLLECTIVE_COLUMNS = columns(f"{WHO} kind:object start_us end_us seconds bytes:float64 "
                             "group:int64 exposed_s alg_bytes_s bus_bytes_s:float64 "
                             "on_gpu:bool phase owner unit:object prefetched:bool "
                             "hook_s compute_before_s compute_after_s:float64 functional:bool")
#: Each DistributedDataParallel of a process: its settings and buckets (doctor.probes.ddp).
DDP_COLUMNS = columns(f"{WHO} bucket_cap_bytes buckets:int64 bucket_bytes last_bucket_bytes "
                      "parameter_bytes:float64 dtypes backend:object world_size:int64 "
                      "backward_compute_s backward_comm_s backward_overlap_s:float64 "
                      "gradient_as_bucket_view static_graph find_unused_parameters:bool")
#: The sharded data-parallel modules of a process (doctor.probes.sharding): the API (FSDP2's
#: ``fully_shard``, FSDP1's ``FullyShardedDataParallel`` or the ZeRO-1 optimizer
#: ``ZeroRedundancyOptimizer``, DeepSpeed's ``DeepSpeedEngine``), its units and settings
#: (``settings``: the optimizer's, in words; ``config``: DeepSpeed's ZeRO stage and communication
#: settings, a dict: doctor.probes.deepspeed_config).
SHARDING_COLUMNS = columns(f"{WHO} api:object units:int64 reshard_after_forward:object "
                           "mesh_size:int64 unit_bytes:float64 sharding_strategy "
                           "forward_prefetch backward_prefetch settings config:object")
#: The pipeline schedules of a process (doctor.probes.pipelining): the schedule's class, its
#: micro-batches, the pipeline's stages, this process's stage indices (comma-separated) and the
#: bytes of their parameters.
PIPELINE_COLUMNS = columns(f"{WHO} schedule:object microbatches stages:int64 "
                           "stage_indices:object stage_bytes:float64")
#: The profiler window's events, newest first kept (doctor.trace.window_events), on the process's
#: clock (ns, as its rings).
WINDOW_EVENT_COLUMNS = columns(f"{WHO} kind track name:object t0_ns t1_ns:int64")
#: The profiler window's steps: the trace's step frame, and which process recorded it.
WINDOW_COLUMNS: dict[str, str] = {**STEP_COLUMNS, "node": "int64", "pid": "int64"}
#: The steps of the later windows (opened where the run slowed down), with each one's number
#: (2 for the second window of its process, ...).
LATER_WINDOW_COLUMNS: dict[str, str] = {**WINDOW_COLUMNS, "window": "int64"}


def typed(rows: Iterable[Mapping[str, Any]] | pd.DataFrame, columns: Mapping[str, str]
          ) -> pd.DataFrame:
    """A frame with exactly ``columns``, in that order and of those dtypes (missing: NaN/None)."""
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    frame = frame.reset_index(drop=True)
    n = len(frame)
    missing: dict[str, Any] = {"object": None, "float64": float("nan"), "bool": False}
    out: dict[str, Any] = {}
    for name, dtype in columns.items():
        col = frame[name] if name in frame else pd.Series([missing.get(dtype, 0)] * n)
        if dtype == "float64":
            col = pd.to_numeric(col, errors="coerce")
        elif dtype == "bool":  # a row without it is False, not NaN (which astype makes True)
            col = col.astype(object).where(col.notna(), False)
        elif dtype == "object":  # a row without it is None, whatever pandas filled in
            col = col.astype(object).where(col.notna(), None)
        out[name] = col.astype(dtype)  # type: ignore[call-overload]
    return pd.DataFrame(out, index=range(n))


def empty(columns: Mapping[str, str]) -> pd.DataFrame:
    """A frame of no rows with ``columns`` (numpy arrays: a sixth of the time Series take, and
    a report builds every frame of a RunData empty first)."""
    return pd.DataFrame({c: np.empty(0, dtype=t) for c, t in columns.items()})


def _floats(columns: Iterable[str], *extra: str) -> dict[str, str]:
    return {**dict.fromkeys(columns, "float64"), **dict.fromkeys(extra, "float64")}


#: Every frame of a RunData and its columns.
FRAME_COLUMNS: dict[str, dict[str, str]] = {
    "processes": PROCESS_COLUMNS, "probe_status": PROBE_STATUS_COLUMNS,
    "loaders": LOADER_COLUMNS, "marks": MARK_COLUMNS, "intervals": INTERVAL_COLUMNS,
    "events": EVENT_COLUMNS, "stacks": STACK_COLUMNS, "stack_spans": STACK_SPAN_COLUMNS,
    "host": {**_floats(PROC_COLUMNS, "cpu_pct"), "pid": "int64", "ppid": "int64",
             "node": "int64"},
    "system": {**_floats(SYSTEM_COLUMNS), "node": "int64"},
    "gpu": {**_floats(GPU_COLUMNS), "gpu": "int64", "node": "int64"},
    "gpu_procs": {**_floats(GPU_PROC_COLUMNS), "gpu": "int64", "pid": "int64", "node": "int64"},
    "memory": {**_floats(MEMORY_COLUMNS, "t_s"), "tag": "object", "pid": "int64",
               "rank": "int64", "node": "int64"},
    "window": WINDOW_COLUMNS, "window_status": WINDOW_STATUS_COLUMNS,
    "later_windows": LATER_WINDOW_COLUMNS,
    "later_stacks": {**STACK_COLUMNS, "window": "int64"},
    "later_stack_spans": {**STACK_SPAN_COLUMNS, "window": "int64"},
    "stack_times": STACK_TIME_COLUMNS,
    "model_state": MODEL_STATE_COLUMNS, "optimizers": OPTIMIZER_COLUMNS, "amp": AMP_COLUMNS,
    "compile_causes": COMPILE_CAUSE_COLUMNS, "overflows": OVERFLOW_COLUMNS, "ops": OPS_COLUMNS,
    "collectives": COLLECTIVE_COLUMNS, "ddp": DDP_COLUMNS, "sharding": SHARDING_COLUMNS,
    "pipeline": PIPELINE_COLUMNS,
    "window_events": WINDOW_EVENT_COLUMNS,
    "others": {**_floats(OTHER_COLUMNS), "name": "object", "node": "int64"},
    "fd_scans": {**_floats(SCAN_COLUMNS), "node": "int64"},
    "mounts": {**{c: "object" for c in MOUNT_TEXT}, **_floats(MOUNT_NUMBERS), "node": "int64"},
    "run_steps": RUN_STEPS_COLUMNS,
}


def empty_frames() -> dict[str, pd.DataFrame]:
    """An empty frame, with every column, for each frame of a RunData."""
    return {name: empty(columns) for name, columns in FRAME_COLUMNS.items()}


@dataclass(frozen=True)
class RunRecord:
    """The job as a whole: what ran, where, how it ended, and the parent's probes."""

    kind: str  # RUN, WATCH or TRACE
    sources: tuple[str, ...]  # the run directories or the trace files
    argv: tuple[str, ...] = ()
    exit_code: int | None = None
    signal: int | None = None
    cores: int | None = None
    memory_bytes: int | None = None  # the RAM the job may use (a container's limit if lower)
    peaks: Mapping[str, Any] | None = None  # the machine's roofline (doctor.probes.peaks)
    host: str | None = None
    python: str | None = None
    started: str | None = None
    duration_s: float | None = None
    fd_handoff_s: float | None = None
    probes: Mapping[str, ProbeStatus] = field(default_factory=dict)  # parent-side
    nodes: tuple[str | None, ...] = ()  # one host per node, when several were combined
    t0_ns: Mapping[int, int] = field(default_factory=dict)  # node -> its run's start
    bootstrap_errors: tuple[str, ...] = ()  # one line per process that could not start doctor
    problems: tuple[str, ...] = ()  # records that could not be read and were left out
    tries: tuple[TryRecord, ...] = ()  # doctor try records of the run, oldest first
    gpus: tuple[Mapping[str, Any], ...] = ()  # what each GPU is (gpus.json), with its node
    visible_devices: str | None = None  # the job's CUDA_VISIBLE_DEVICES, when it set one
    links: Mapping[str, Any] | None = None  # the machine's links (doctor.probes.links)
    deaths: tuple[Mapping[str, Any], ...] = ()  # processes killed by a signal (probes.exits)

    @property
    def source(self) -> str:
        """The run directories or trace files as the report names them (comma-separated)."""
        return ", ".join(self.sources)

    @property
    def job_seen(self) -> bool:
        """Whether doctor ran the job (a trace alone says nothing of its exit)."""
        return self.kind != TRACE


@dataclass(frozen=True)
class RunData:
    """Every frame of one run (see the module docstring and the ``*_COLUMNS`` above).

    - ``processes``: one row per process folder (or per trace file);
    - ``probe_status``: the in-process probes each process started, or why not;
    - ``loaders``: DataLoader settings seen, one row per loader of each process;
    - ``marks``: ``doctor.step()`` calls; ``intervals``: DataLoader waits, backward and optimizer
      calls, worker fetches and collates; ``events``: the profiler window's start and stop;
    - ``stacks``/``stack_spans``: stack samples of each sampled process and how they were taken;
    - ``host``/``system``/``gpu``: the parent's samples (doctor.store.samples columns), and
      ``gpu_procs`` the processes NVML saw on each GPU;
    - ``memory``: CUDA allocator snapshots;
    - ``window``: one row per step the profiler recorded (doctor.trace.steps.STEP_COLUMNS,
      with ``node`` and ``pid``), and ``window_status`` whether each process's trace was read;
    - ``model_state``: bytes of parameters, gradients and optimizer state by device and dtype,
      at the window's start and at exit (doctor.probes.model_state); ``optimizers``: each
      optimizer's class and foreach/fused settings, as it first stepped (doctor.probes.steps);
      ``amp``: the autocasts each process entered and its GradScalers' settings
      (doctor.probes.amp); ``compile_causes``: each recompilation's failed guard and each
      graph break's reason and place (doctor.probes.compile_causes); ``overflows``: where the
      gradients of skipped iterations first overflowed (doctor.probes.overflow_watch);
    - ``ops``: one row per op name of each process's profiler window (doctor.trace.ops);
    - ``collectives``: one row per collective of each window (doctor.trace.comm_calls);
    - ``ddp``: each DistributedDataParallel's settings and buckets (doctor.probes.ddp);
    - ``sharding``: each process's FSDP units and settings (doctor.probes.sharding);
    - ``pipeline``: each process's pipeline schedules and stages (doctor.probes.pipelining);
    - ``window_events``: the profiler window's events on the process's clock, capped
      (doctor.trace.window_events), and ``window_status.events`` how many the trace had;
    - ``others``: processes outside the job that took cores, per scan (doctor.probes.others);
    - ``fd_scans``: the parent's scans of the job's descriptors (data files open, sockets,
      connections, the namespace's received bytes), and ``mounts`` the mounts its data files
      were on (doctor.probes.open_files);
    - ``later_windows``: the steps of each later profiler window (opened where the run slowed
      down: ``trace-N.json``), as ``window``'s, with the window's number N; ``later_stacks``
      and ``later_stack_spans`` the stacks sampled beside each (``stacks-N.txt``), with N.
    - ``stack_times``: the main thread's samples of every window on the time axis, as runs of
      identical samples (doctor.store.stack_times), with the window's number.
    - ``run_steps``: every counted step of each process, in buckets (doctor.record.run_steps).
    """

    record: RunRecord
    processes: pd.DataFrame
    probe_status: pd.DataFrame
    loaders: pd.DataFrame
    marks: pd.DataFrame
    intervals: pd.DataFrame
    events: pd.DataFrame
    stacks: pd.DataFrame
    stack_spans: pd.DataFrame
    host: pd.DataFrame
    system: pd.DataFrame
    gpu: pd.DataFrame
    gpu_procs: pd.DataFrame
    memory: pd.DataFrame
    window: pd.DataFrame
    window_status: pd.DataFrame
    model_state: pd.DataFrame
    optimizers: pd.DataFrame
    amp: pd.DataFrame
    compile_causes: pd.DataFrame
    overflows: pd.DataFrame
    ops: pd.DataFrame
    collectives: pd.DataFrame
    ddp: pd.DataFrame
    window_events: pd.DataFrame
    sharding: pd.DataFrame
    pipeline: pd.DataFrame
    others: pd.DataFrame
    fd_scans: pd.DataFrame
    mounts: pd.DataFrame
    later_windows: pd.DataFrame
    later_stacks: pd.DataFrame
    later_stack_spans: pd.DataFrame
    stack_times: pd.DataFrame
    run_steps: pd.DataFrame
    _by_process: dict[str, dict[Process, pd.DataFrame]] = field(
        default_factory=dict, init=False, repr=False, compare=False)
    _by_ring: dict[tuple[int, int, int, str], pd.DataFrame] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    @property
    def frames(self) -> dict[str, pd.DataFrame]:
        return {k: v for k, v in vars(self).items() if isinstance(v, pd.DataFrame)}

    def intervals_of(self, process: Process, name: str
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(t0_ns, t1_ns, key) of one process's intervals of ``name``, sorted by start (split
        by process and name once, on first use)."""
        if not self._by_ring and not self.intervals.empty:
            self._by_ring.update(split_by(self.intervals, "node", "rank", "pid", "name"))
        rows = self._by_ring.get((*process, name))
        if rows is None:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, empty
        t0 = rows["t0_ns"].to_numpy(np.int64)
        order = np.argsort(t0, kind="stable")
        return (t0[order], rows["t1_ns"].to_numpy(np.int64)[order],
                rows["key"].to_numpy(np.int64)[order])

    def rows(self, name: str, process: Process) -> pd.DataFrame:
        """The rows of frame ``name`` that one process recorded. Each frame is split by process
        once, on first use: a run of hundreds of ranks asks for every process's rows."""
        index = self._by_process.get(name)
        if index is None:
            index = self._by_process[name] = split_by(self.frames[name], "node", "rank", "pid")
        found = index.get(process)
        return found if found is not None else self.frames[name].iloc[0:0]


def combine(runs: list[RunData]) -> RunData:
    """Several nodes of one job as one run: frames stacked with each node's index, one record
    (the first node's, with the first failure's exit status and every node's host)."""
    if len(runs) == 1:
        return runs[0]
    frames: dict[str, pd.DataFrame] = {}
    for name in runs[0].frames:
        parts = [getattr(r, name).assign(node=i) for i, r in enumerate(runs)]
        kept = [p for p in parts if not p.empty]
        frames[name] = pd.concat(kept, ignore_index=True) if kept else parts[0]
    records = [r.record for r in runs]
    first = records[0]
    failed = [r for r in records if r.job_seen and (r.exit_code is None or r.exit_code != 0)]
    record = replace(
        first,
        sources=tuple(s for r in records for s in r.sources),
        exit_code=failed[0].exit_code if failed else first.exit_code,
        signal=failed[0].signal if failed else first.signal,
        nodes=tuple(r.host for r in records),
        t0_ns={i: r.t0_ns.get(0, 0) for i, r in enumerate(records)},
        bootstrap_errors=tuple(e for r in records for e in r.bootstrap_errors),
        problems=tuple(p for r in records for p in r.problems),
        gpus=tuple({**g, "node": i} for i, r in enumerate(records) for g in r.gpus),
    )
    return RunData(record=record, **frames)
