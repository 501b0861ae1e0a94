"""A process folder's stack samples beside each of its windows, as rows of the run's frames
(doctor.store.rundata: ``stacks``, ``stack_spans``, ``stack_times``), for doctor.store.reader.
One that cannot be read is left out, with a note."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from doctor.store import layout
from doctor.store.layout import pid_of
from doctor.store.stack_times import read_stack_times
from doctor.store.stacks import (
    DEFAULT_RATE_HZ,
    MAIN_THREAD,
    PRODUCER_THREAD,
    read_stacks,
    read_stacks_meta,
)

from .readback import as_float, as_int


def stack_rows(proc_dir: Path, who: dict[str, Any], window: int, problems: list[str]
            ) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The stack samples beside a process's ``window``-th window (rows of the stacks frame)
    and how they were taken (a row of stack_spans), or none; one that cannot be read is left
    out, with a note."""
    txt, desc = layout.stacks_names(window)
    taken = read_stacks_meta(proc_dir, window)
    samples = read_stacks(proc_dir, taken, window) if taken is not None else None
    if (os.path.lexists(proc_dir / desc) and taken is None) or (
            taken is not None and samples is None and os.path.lexists(proc_dir / txt)):
        problems.append(f"{proc_dir}: its stack samples cannot be read: left out")
        taken = samples = None
    rows = [] if samples is None else [
        *({**who, "stack": s, "count": n, "thread": MAIN_THREAD}
          for s, n in samples.stacks.items()),
        *({**who, "stack": s, "count": n, "thread": PRODUCER_THREAD}
          for s, n in samples.producers.items())]
    if taken is None:
        return rows, None
    rate = as_float(taken.get("rate_hz"))
    return rows, {**who, "recorder": str(taken.get("recorder", "?")),
                  "rate_hz": rate if rate and rate > 0 else DEFAULT_RATE_HZ,
                  "start_ns": as_int(taken.get("start_ns")) or 0,
                  "end_ns": as_int(taken.get("end_ns")) or 0,
                  "taken": as_int(taken.get("taken")) or 0,
                  **{k: _count(taken.get(k)) for k in ("busy_threads", "threads")}}


def stack_time_rows(proc_dir: Path, who: dict[str, Any], window: int,
                 span: dict[str, Any] | None, problems: list[str]) -> list[dict[str, Any]]:
    """The main thread's runs of samples beside a process's ``window``-th window, on the
    shared clock (rows of the stack_times frame); none without the span they are timed from."""
    runs = read_stack_times(proc_dir, pid_of(proc_dir), window, problems) if span else None
    if not runs or span is None:
        return []
    start = int(span["start_ns"])
    return [{**who, "t0_ns": start + t0 * 1000, "t1_ns": start + t1 * 1000, "stack": stack,
             "window": window} for t0, t1, stack in runs]


def _count(value: object) -> float:
    """A thread count of stacks.json, NaN where it is not one (an older run, the in-process
    sampler)."""
    found = as_int(value)
    return float(found) if found is not None and found >= 0 else float("nan")
