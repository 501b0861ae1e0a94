"""What NVML's counters say about the time outside the input wait, where the profiler window
cannot: a GPU rank without a window (``--window off``, a job that ended before it) gets a coarse
split of that time into transfer and compute, and a rank with a window gets the window's kernel
time checked against the GPU's utilisation over the whole run.

Without a window, a rank's time outside the input wait ``r`` (a fraction of its wall time) holds
the GPU's busy time ``u`` (NVML utilisation) and whatever kept the GPU idle. Copies that the
kernels did not hide can only be in that idle part: transfer is the PCIe link's busy time (its
bytes at the link's full rate, ``p``) up to ``r - u``; the rest is compute (kernels, and the host
time that feeds them). Copies overlapped with kernels cost nothing and count as none; copies at
less than the link's rate count as less than they took: the split is coarser than the window's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd

from doctor.analyse.gpus import GpuCounters
from doctor.analyse.steps import WINDOW, RankSteps
from doctor.analyse.window import WindowSplit

COARSE_NOTE = ("No profiler window on {ranks}: the time outside the input wait is split into "
               "transfer and compute by NVML's utilisation and PCIe counters over the run "
               "(coarser than the window: host time between kernels counts as compute, and "
               "communication is not told apart). Run with the window for the full split.")
DISAGREE = 0.25  # NVML's busy share and the window's kernel share this far apart: say so


def counter_splits(counters: GpuCounters | None, ranks: Mapping[int, RankSteps],
                   table: pd.DataFrame, windows: Mapping[int, WindowSplit]
                   ) -> tuple[dict[int, WindowSplit], list[str]]:
    """(a coarse split for each GPU rank that has no window, the note that says so)."""
    if counters is None:
        return {}, []
    out: dict[int, WindowSplit] = {}
    for rank, steps in ranks.items():
        gpu = counters.of_rank(rank)
        if rank in windows or steps.kind == WINDOW or gpu is None or math.isnan(gpu.util):
            continue
        mine = table[(table["rank"] == rank) & table["analyzed"]]
        wall = float(mine["wall_s"].sum())
        if wall <= 0:
            continue
        rest = 1.0 - float(mine["wait_s"].sum()) / wall
        if rest <= 0:
            continue
        busy = min(gpu.util, rest)
        link = 0.0 if math.isnan(gpu.pcie_busy) else gpu.pcie_busy
        transfer = min(link, rest - busy) / rest
        out[rank] = WindowSplit(
            fractions={"transfer": transfer, "compute": 1.0 - transfer, "communication": 0.0,
                       "other": 0.0},
            device="cuda", device_compute=busy / rest)
    if not out:
        return out, []
    names = sorted(out)
    which = f"rank {names[0]}" if len(names) == 1 else f"ranks {_span(names)}"
    return out, [COARSE_NOTE.format(ranks=which)]


def crosscheck_notes(counters: GpuCounters | None, window: pd.DataFrame) -> list[str]:
    """Where the window's kernel-busy share and NVML's utilisation over the run disagree."""
    if counters is None or window.empty or "gpu_busy_s" not in window:
        return []
    notes = []
    rows = window[window["analyzed"]] if "analyzed" in window else window
    rows = rows[rows["device"] == "cuda"]
    for rank, mine in rows.groupby("rank"):
        gpu = counters.of_rank(int(mine["rank"].iloc[0]))
        step = float(mine["dur_s"].sum())
        if gpu is None or step <= 0 or math.isnan(gpu.util):
            continue
        # NVML counts the time a kernel ran: copies with no kernel beside them are not in it
        copies = float(mine["transfer_exposed_s"].sum()) if "transfer_exposed_s" in mine else 0.0
        busy = (float(mine["gpu_busy_s"].sum()) - copies) / step
        if abs(busy - gpu.util) >= DISAGREE:
            notes.append(
                f"Rank {rank}: kernels ran {busy:.0%} of the profiler window's steps, but NVML "
                f"saw GPU {gpu.index} busy {gpu.util:.0%} over the analysed steps: the window's "
                "steps are not typical of the run (phases, evaluation, a warm-up), or the GPU "
                "also ran work the window did not see.")
    return notes


def _span(ranks: list[int]) -> str:
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(str(r) for r in ranks)
