"""The step ledger: one row per (rank, step), seconds per category, adding up to the step's wall.

Built once, from the step table (doctor.analyse.step_table) and what the other stages measured:

- input: the training process's DataLoader wait, split into io, decode and preprocess by where
  the loading work went (doctor.analyse.split); when that could not be measured (no stack
  samples), it stays whole in an extra ``input`` column;
- stack sampling's pauses, measured in each step it overlapped (``sampler_s``,
  doctor.analyse.thread_time), are taken out of the step's wall time first: the ledger's
  ``wall_s`` is the step as the job would have run it;
- on a CPU job, compute is what the training thread did on a core: where a step's time outside
  the input wait was blocked more than is usual for the job's steps (``blocked_s``, from the
  parent's schedstat samples; usual: the analysed steps' median, where a window's split
  describes them, none without a window), its compute shrinks with its time on a core and the
  rest is ``other`` (``blocked_other_s``): an 8 s blocking read is not 8 s of compute;
- the rest of the step is split between transfer, compute, communication and other by the
  window's fractions (doctor.analyse.window); a step that is the window's own keeps its own
  split; without a window, the rest is compute and a note says so;
- with DataLoader workers, the part of the rest that the training process spent waiting for a
  core the workers held (``contention``, doctor.analyse.contention) moves to the input stages:
  without the loading, the cores would have been the training's; the part it waited for a core
  the communication threads held (``comm_contention``) moves to communication, for the same
  reason;
- batches built in the loop itself (no DataLoader) move from other, then compute, to their
  stages.

``device_compute_s`` is the time the device computes (GPU kernels on a GPU job, the compute
itself on a CPU job), for the verdict's communication threshold.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from doctor.analyse.phases import TRAIN
from doctor.analyse.step_table import OWN_COLUMNS
from doctor.analyse.thread_time import THREAD_COLUMNS
from doctor.analyse.window import WindowSplit
from doctor.categories import CATEGORIES, NON_INPUT, UNSPLIT_INPUT
from doctor.verdict import LEDGER_COLUMNS

#: The evidence columns the ledger keeps beside the categories (seconds).
EVIDENCE_COLUMNS = (UNSPLIT_INPUT, "wait_s", "contention_s", "comm_contention_s", "backward_s",
                    "optimizer_s", "fetch_s", "device_compute_s", *THREAD_COLUMNS,
                    "blocked_other_s")
FLAGS = ("window_close", "in_window", "sampled", "in_range", "compiling", "skipped")
#: Counts the ledger keeps beside: ``micro_batches``, the backward() calls in the step (more than
#: one: gradient accumulation; nan where none was recorded).
COUNT_COLUMNS = ("micro_batches",)
#: A job whose ordinary step's thread is on a core less than this part of its time outside the
#: input wait: its window's compute is not the thread's own (intra-op threads, say); kept.
MIN_USUAL_ON_CORE = 0.05


def build_ledger(table: pd.DataFrame, windows: Mapping[int, WindowSplit] | None = None,
                 input_split: Mapping[int, Mapping[str, float]] | None = None,
                 outside: Mapping[int, Mapping[str, float]] | None = None,
                 contention: Mapping[int, float] | None = None,
                 comm_contention: Mapping[int, float] | None = None,
                 cpu: bool = True) -> pd.DataFrame:
    """The ledger of a step table. Per rank: ``windows`` splits the time outside the input
    wait, ``input_split`` the wait into io, decode and preprocess, ``outside`` gives the
    fraction of each step spent building input outside a DataLoader, per stage, and
    ``contention`` the fraction of the time outside the wait the training process waited for a
    core its DataLoader workers held (``comm_contention``: that its communication threads held).
    ``cpu``: the job computes on its CPU (a GPU job's thread blocks while its GPU computes)."""
    if table.empty:
        return empty_ledger()
    parts = []
    for _rank, rows in table.groupby("rank", sort=True):
        rank = int(rows["rank"].iloc[0])
        parts.append(_rank_ledger(rows, (windows or {}).get(rank), (input_split or {}).get(rank),
                                  (outside or {}).get(rank), (contention or {}).get(rank, 0.0),
                                  (comm_contention or {}).get(rank, 0.0), cpu))
    return pd.concat(parts, ignore_index=True)


def empty_ledger() -> pd.DataFrame:
    cols: dict[str, pd.Series] = {}
    for c in (*LEDGER_COLUMNS, *EVIDENCE_COLUMNS, *FLAGS, *COUNT_COLUMNS):
        dtype = "bool" if c in (*FLAGS, "warmup", "analyzed") else "int64" \
            if c in ("rank", "step") else "float64"
        cols[c] = pd.Series(dtype=dtype)
    return pd.DataFrame({**cols, "phase": pd.Series(dtype="object")})


def _rank_ledger(rows: pd.DataFrame, window: WindowSplit | None,
                 input_split: Mapping[str, float] | None, outside: Mapping[str, float] | None,
                 contention: float, comm_contention: float = 0.0, cpu: bool = True
                 ) -> pd.DataFrame:
    n = len(rows)
    sampler = np.nan_to_num(_column(rows, "sampler_s"))
    wall = rows["wall_s"].to_numpy(np.float64) - sampler
    wait = np.minimum(rows["wait_s"].to_numpy(np.float64), wall)
    rest = wall - wait
    own = rows[list(OWN_COLUMNS)].to_numpy(np.float64)
    has_own = ~np.isnan(own[:, 0])
    data: dict[str, np.ndarray] = {c: np.zeros(n) for c in CATEGORIES}
    contended = rest * min(max(contention, 0.0), 1.0)
    comm_contended = rest * min(max(comm_contention, 0.0), 1.0 - min(max(contention, 0.0), 1.0))
    split = window.fractions if window else {"compute": 1.0}
    for category in NON_INPUT:
        mine = own[:, list(OWN_COLUMNS).index(f"own_{category}_s")]
        data[category] = np.where(has_own, mine,
                                  (rest - contended - comm_contended) * split.get(category, 0.0))
    blocked = np.zeros(n)
    if cpu and (window is None or window.device != "cuda"):
        on_core = _on_core_vs_usual(rows, rest, wait, sampler, window is not None)
        blocked = np.where(has_own, 0.0, data["compute"] * (1.0 - on_core))
    data["compute"] = data["compute"] - blocked
    data["other"] = data["other"] + blocked
    data["communication"] = data["communication"] + np.where(has_own, 0.0, comm_contended)
    unsplit: np.ndarray = np.zeros(n)
    if input_split:
        for stage, frac in input_split.items():
            data[stage] = data[stage] + (wait + contended) * frac
    else:
        unsplit = wait + contended
    for stage, frac in (outside or {}).items():
        # Batches built in the loop are Python outside torch ops: the window counted them as
        # other (or, without a window, as compute); take them from there.
        want: np.ndarray = wall * frac
        for source in ("other", "compute"):
            moved = np.minimum(data[source], want)
            data[source] = data[source] - moved
            data[stage] = data[stage] + moved
            want = want - moved
    on_device = window.device_compute * (rest - contended - comm_contended) \
        if window and window.device == "cuda" else data["compute"]
    out = {c: rows[c].to_numpy() for c in ("rank", "step", "start_s", "wait_s",
                                           "backward_s", "optimizer_s", "fetch_s", "warmup",
                                           "analyzed", *FLAGS, *COUNT_COLUMNS)}
    out.update(data)
    out["wall_s"] = wall
    for col in THREAD_COLUMNS:
        out[col] = _column(rows, col)
    out["blocked_other_s"] = blocked
    out[UNSPLIT_INPUT] = unsplit
    out["contention_s"] = contended
    out["comm_contention_s"] = np.where(has_own, 0.0, comm_contended)
    out["device_compute_s"] = np.where(has_own, own[:, -1], on_device)
    frame = pd.DataFrame({c: out[c] for c in (*LEDGER_COLUMNS, *EVIDENCE_COLUMNS, *FLAGS,
                                              *COUNT_COLUMNS)})
    # each step's phase (doctor.analyse.phase_steps): only training steps are analysed
    return frame.assign(phase=rows["phase"].to_numpy() if "phase" in rows else TRAIN)


def _column(rows: pd.DataFrame, name: str) -> np.ndarray:
    return rows[name].to_numpy(np.float64) if name in rows else np.full(len(rows), np.nan)


def _on_core_vs_usual(rows: pd.DataFrame, rest: np.ndarray, wait: np.ndarray,
                      sampler: np.ndarray, split_known: bool) -> np.ndarray:
    """Per step, the part of its compute the training thread can have done: its time on a core
    outside the input wait, as a fraction of that time, over the usual fraction (the analysed
    steps' median, where a split, the window's, describes an ordinary step; all of the time
    otherwise), at most 1; 1 where not measured, or where the usual step is all but blocked."""
    measured = _column(rows, "blocked_s")
    known = ~np.isnan(measured) & (rest > 0)
    safe = np.where(rest > 0, rest, 1.0)
    blocked = np.clip(np.nan_to_num(measured) - sampler - wait, 0.0, np.maximum(rest, 0.0))
    on_core = 1.0 - blocked / safe
    usual = 1.0
    steady = known & rows["analyzed"].to_numpy(bool)
    if split_known and steady.any():
        usual = float(np.median(on_core[steady]))
    if usual < MIN_USUAL_ON_CORE:
        return np.ones(len(rows))
    return np.where(known, np.clip(on_core / usual, 0.0, 1.0), 1.0)


@dataclass(frozen=True)
class StepMarks:
    """The steps the step chart marks, each as (first, last) step number, None where the
    ledger has none. With several ranks, each span covers every rank's (each rank has its own
    warm-up, deep window and stack sampling, normally at the same steps)."""

    warmup: tuple[int, int] | None = None
    window: tuple[int, int] | None = None  # the torch.profiler deep window (``in_window``)
    sampling: tuple[int, int] | None = None  # stack sampling (``sampled``)


def step_marks(ledger: pd.DataFrame) -> StepMarks:
    """Which steps of ``ledger`` are warm-up, deep window and stack sampling, by step number."""
    if ledger is None or ledger.empty or "step" not in ledger:
        return StepMarks()
    frame = ledger.dropna(subset=["step"])
    return StepMarks(*(_span(frame, flag) for flag in ("warmup", "in_window", "sampled")))


def _span(frame: pd.DataFrame, flag: str) -> tuple[int, int] | None:
    steps = frame.loc[frame[flag].fillna(False).astype(bool) if flag in frame
                     else pd.Series(False, index=frame.index), "step"]
    if steps.empty:
        return None
    return int(steps.min()), int(steps.max())
