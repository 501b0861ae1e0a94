"""Across ranks: the per-rank table, and stragglers (ranks that the others wait for).

In a data-parallel job every rank meets the others in collectives each step (DDP's gradient
all-reduce), so every rank's step takes as long as the slowest rank's: a slow rank does not show
in wall time but in the others' **communication**, which includes waiting for it. What tells the
slow rank apart is its own **non-communication** time (input, compute, transfer, other): a
straggler is a rank whose non-communication time per step is consistently above the other ranks'.
Its extra time is split by category from its own ledger to name the likely cause; when the extra
time is compute that the rank's CPU time does not account for, the rank was runnable but not
running: host contention.

Pure functions over the ledger (doctor.analyse.ledger) and the host samples; the search's result is
evidence (StragglerSearch, below) that the rule in doctor.rules.distributed words.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from doctor.categories import CATEGORIES, UNSPLIT_INPUT

HOST_CONTENTION = "host contention"


@dataclass(frozen=True)
class Straggler:
    """One rank that the others wait for."""

    rank: int
    extra_s: float  # median extra non-communication seconds per step, vs the other ranks
    step_s: float  # median step wall time over the compared ranks and steps
    slower_fraction: float  # share of the shared steps in which it was slower than the others
    steps: int  # shared steps compared
    cause: str  # input | transfer | compute | other | host contention
    cause_category: str  # the ledger category with the most extra time
    extra_by_category: dict[str, float] = field(default_factory=dict)  # mean s/step vs others
    waiting: dict[int, float] = field(default_factory=dict)  # rank -> extra comm s/step
    cpu_extra_s: float | None = None  # its CPU seconds per step above the others', if sampled


@dataclass(frozen=True)
class StragglerSearch:
    """The stragglers found, and a rank that looked slower only through the profiler window's
    split (a few steps) but not step by step: noise, or extra work inside backward()."""

    stragglers: list[Straggler]
    window_only: dict[int, float] = field(default_factory=dict)  # rank -> extra s/step


#: Cause groups: the ledger categories whose extra time points to each likely cause.
CAUSE_GROUPS: dict[str, tuple[str, ...]] = {
    "input": ("io", "decode", "preprocess", "input"),  # "input": wait not split (yet)
    "transfer": ("transfer",),
    "compute": ("compute",),
    "other": ("other",),
}

MIN_SHARED_STEPS = 5  # analysed steps that every compared rank has
MIN_EXTRA_SHARE = 0.10  # extra non-communication time, as a share of the median step
MIN_EXTRA_S = 0.0005
CONSISTENT = 0.7  # share of the shared steps in which the rank is slower than the others
WAIT_SHARE = 0.5  # a rank waits for the straggler when its extra communication is >= this share
CPU_EXPLAINS = 0.5  # extra CPU time per step that accounts for at least this share of the extra
CONFIRM = 0.25  # the extra seen step by step outside backward(), as a share of the ledger's
# (a rank that computes more does about a third of it in forward and optimizer)


def rank_table(ledger: pd.DataFrame, window: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per rank: analysed steps, median step time, non-communication time per step,
    and the shares of each category. With the profiler window's per-step frame
    (doctor.trace.steps), also the collectives per step and the part of them hidden behind
    other work on that rank (with DDP: the gradient all-reduce overlapped by backward)."""
    analysed = ledger[ledger["analyzed"]] if "analyzed" in ledger else ledger
    if analysed.empty or analysed["rank"].nunique() < 2:
        return pd.DataFrame()
    g = analysed.groupby("rank")
    wall = g["wall_s"].sum()
    table = pd.DataFrame({"steps": g.size(), "median_step_s": g["wall_s"].median()})
    non_comm = analysed["wall_s"] - analysed["communication"]
    table["median_non_comm_s"] = non_comm.groupby(analysed["rank"]).median()
    for c in _categories(analysed):
        if c != "input" or bool((analysed[c] > 0).any()):  # input: wait not split (yet)
            table[f"{c}_share"] = g[c].sum() / wall
    comm = window_comm(window)
    if not comm.empty:
        table = table.join(comm, how="left")
    return table.reset_index()


def window_comm(window: pd.DataFrame | None) -> pd.DataFrame:
    """Per rank, from the profiler window: collectives per step, the exposed part, and the
    share of them hidden behind other work. Empty when no window recorded a collective."""
    cols = ("rank", "comm_s", "comm_exposed_s")
    if window is None or window.empty or any(c not in window for c in cols):
        return pd.DataFrame()
    g = window.groupby("rank")
    comm = g["comm_s"].mean()
    exposed = g["comm_exposed_s"].mean()
    if not (comm > 0).any():
        return pd.DataFrame()
    hidden = (1.0 - exposed / comm).where(comm > 0).clip(lower=0.0, upper=1.0)
    return pd.DataFrame({"window_comm_s": comm,
                         "window_comm_exposed_s": exposed,
                         "window_comm_hidden_fraction": hidden})


def search_stragglers(ledger: pd.DataFrame, host: pd.DataFrame | None = None,
                      rank_pids: Mapping[int, int] | None = None) -> StragglerSearch:
    """The ranks whose non-communication time per step is consistently above the others', most
    extra first. A straggler is a minority: at most half the ranks (one of two).

    ``ledger``: the analysed steps of every rank. ``host`` and ``rank_pids`` (each rank's main
    process) let a compute-side excess that CPU time does not explain be called contention.

    Two measures: the ledger's non-communication time (communication from the profiler
    window's split: a few steps, applied to all of them) and, where backward() was recorded,
    the time outside backward measured on every step (see _own_time). A rank is a straggler
    when it is consistently slower by the second, or by the first with the second agreeing
    (a rank that computes more does part of it outside backward): a noisy window alone names no
    one. Its extra time is the larger of the two.
    """
    analysed = ledger[ledger["analyzed"]] if "analyzed" in ledger else ledger
    if analysed.empty or analysed["rank"].nunique() < 2:
        return StragglerSearch([])
    frame = analysed.assign(non_comm_s=analysed["wall_s"] - analysed["communication"])
    non_comm = frame.pivot_table(index="rank", columns="step", values="non_comm_s",
                                 aggfunc="first").dropna(axis=1)
    if non_comm.shape[1] < MIN_SHARED_STEPS:
        return StragglerSearch([])
    ranks = non_comm.index.to_numpy()
    steps = non_comm.columns
    shared = frame[frame["step"].isin(steps)]
    matrix = non_comm.to_numpy(dtype=np.float64)
    step_s = float(np.median(shared["wall_s"]))
    threshold = max(MIN_EXTRA_S, MIN_EXTRA_SHARE * step_s)
    extra_cols = [c for c in ("wall_s", "backward_s") if c in shared]
    per_rank = shared.groupby("rank")[[*_categories(shared), *extra_cols]].mean()
    spans = shared.groupby("rank").agg(lo=("start_s", "min"), hi=("start_s", "max"))
    spans["hi"] += float(shared["wall_s"].max())
    cpu = _cpu_per_step(host, rank_pids, per_rank, spans)

    own = _own_time(frame, non_comm)
    signal = own if own is not None else matrix

    found: list[Straggler] = []
    window_only: dict[int, float] = {}
    flagged: list[int] = []
    limit = max(1, len(ranks) // 2)
    for idx in np.argsort(-np.median(signal, axis=1), kind="stable")[:limit]:
        others = np.array([i for i in range(len(ranks)) if i != idx and i not in flagged])
        if others.size == 0:
            break
        extra, slower = _excess(matrix, idx, others)
        window_says = extra >= threshold and slower >= CONSISTENT
        if own is not None:
            own_extra, own_slower = _excess(own, idx, others)
            steady = own_slower >= CONSISTENT
            measured = steady and own_extra >= threshold
            confirmed = window_says and steady and own_extra >= CONFIRM * extra
            if not (measured or confirmed):
                if window_says:
                    window_only[int(ranks[idx])] = extra
                break
            extra, slower = max(extra, own_extra), own_slower
        elif not window_says:
            break
        flagged.append(int(idx))
        found.append(_describe(int(ranks[idx]), [int(ranks[i]) for i in others], extra, step_s,
                               slower, len(steps), per_rank, cpu))
    return StragglerSearch(found, window_only)


def _excess(matrix: np.ndarray, idx: int, others: np.ndarray) -> tuple[float, float]:
    """(median extra seconds per step of row ``idx`` over the others' per-step median, share
    of the steps in which it is above it)."""
    excess = matrix[idx] - np.median(matrix[others], axis=0)
    return float(np.median(excess)), float(np.mean(excess > 0))


def _own_time(frame: pd.DataFrame, non_comm: pd.DataFrame) -> np.ndarray | None:
    """Per (rank, shared step): the time measured outside ``backward()`` on every step (input
    wait, forward, optimizer, Python), or None when no backward was recorded. DDP waits for the
    other ranks inside backward (the all-reduce completes at its end), so a rank slower outside
    backward is slower on its own, step after step, whatever the profiler window saw."""
    if "backward_s" not in frame or not bool((frame["backward_s"] > 0).any()):
        return None
    own = frame.assign(own_s=frame["wall_s"] - frame["backward_s"]).pivot_table(
        index="rank", columns="step", values="own_s", aggfunc="first")
    return own.reindex(index=non_comm.index, columns=non_comm.columns).to_numpy(
        dtype=np.float64)


def _categories(ledger: pd.DataFrame) -> list[str]:
    """The ledger's category columns (with ``input`` when some input wait is not split)."""
    return [c for c in (*CATEGORIES, UNSPLIT_INPUT) if c in ledger]


def _describe(rank: int, others: list[int], extra: float, step_s: float, slower: float,
              steps: int, per_rank: pd.DataFrame, cpu: dict[int, float] | None) -> Straggler:
    means = {str(c): _by_rank(per_rank, str(c)) for c in per_rank.columns}
    by_category = {c: v[rank] - float(np.median([v[r] for r in others]))
                   for c, v in means.items() if c not in ("communication", "wall_s",
                                                          "backward_s")}
    by_group = {g: sum(by_category.get(c, 0.0) for c in cats)
                for g, cats in CAUSE_GROUPS.items()}
    cause = max(by_group, key=lambda g: by_group[g])
    cause_category = max((c for c in CAUSE_GROUPS[cause] if c in by_category),
                         key=lambda c: by_category[c])
    cpu_extra = None
    peers = [cpu[r] for r in others if cpu is not None and r in cpu]
    if cpu is not None and rank in cpu and peers:
        cpu_extra = cpu[rank] - float(np.median(peers))
        if cause in ("compute", "other") and cpu_extra < CPU_EXPLAINS * by_group[cause]:
            cause = HOST_CONTENTION
    # what a rank waits: its extra communication or, as DDP waits inside backward(), its
    # extra time in backward (the window's split may not cover all of the wait)
    comm = means["communication"]
    backward = means.get("backward_s", dict.fromkeys(means["communication"], 0.0))
    waiting = {r: max(comm[r] - comm[rank], backward[r] - backward[rank]) for r in others}
    waiting = {r: w for r, w in waiting.items() if w >= WAIT_SHARE * extra}
    return Straggler(rank=rank, extra_s=extra, step_s=step_s, slower_fraction=slower,
                     steps=steps, cause=cause, cause_category=cause_category,
                     extra_by_category=by_category, waiting=waiting, cpu_extra_s=cpu_extra)


def _by_rank(frame: pd.DataFrame, column: str) -> dict[int, float]:
    """A column of a frame indexed by rank, as {rank: value}."""
    return dict(zip((int(r) for r in frame.index), frame[column].to_numpy(dtype=np.float64)
                    .tolist(), strict=True))


def _cpu_per_step(host: pd.DataFrame | None, rank_pids: Mapping[int, int] | None,
                  per_rank: pd.DataFrame, spans: pd.DataFrame) -> dict[int, float] | None:
    """CPU seconds per step of each rank's main process: its CPU use over the compared steps
    (over the whole run when too few samples fall in them) times its mean step. None without
    samples, or when ranks share pids (several nodes: pids may repeat)."""
    if host is None or host.empty or not rank_pids or "cpu_s" not in host:
        return None
    if len(set(rank_pids.values())) != len(rank_pids):
        return None
    wall, lo, hi = _by_rank(per_rank, "wall_s"), _by_rank(spans, "lo"), _by_rank(spans, "hi")
    pids = host["pid"].to_numpy()
    t_all = host["t_s"].to_numpy(dtype=np.float64)
    cpu_all = host["cpu_s"].to_numpy(dtype=np.float64)
    out: dict[int, float] = {}
    for rank, pid in rank_pids.items():
        if rank not in wall:
            continue
        mine = pids == pid
        t, cpu = t_all[mine], cpu_all[mine]
        if rank in lo:
            inside = (t >= lo[rank]) & (t <= hi[rank])
            if inside.sum() >= 2:
                t, cpu = t[inside], cpu[inside]
        if len(t) < 2 or t[-1] <= t[0]:
            continue
        out[rank] = float(cpu[-1] - cpu[0]) / float(t[-1] - t[0]) * wall[rank]
    return out if len(out) >= 2 else None
