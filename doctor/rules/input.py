"""Input rules: how long the training loop waits for batches, and the loader settings to change.

Until the io/decode/preprocess split is measured, DataLoader wait sits in ``preprocess`` and the
finding says so. The speedup estimate models loading spread over ``k`` workers running beside
the training loop, limited by the cores that loading and training share:
step ~ max(rest of step, load / k, (load + rest) / cores), where ``load`` is the time one batch
takes to build: the wait itself with num_workers=0, and about ``workers x step`` when ``workers``
processes together deliver one batch per step.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from doctor.rules.base import RuleInputs, RuleSkipped, rule
from doctor.verdict import Finding, Fix

MIN_SHARE = 0.10


def suggested_workers(cores: int) -> int:
    """Workers to try: one per core, leaving one for the training loop on larger machines."""
    return max(1, min(8, cores if cores <= 2 else cores - 1))


def estimate_with_workers(load: float, rest: float, cores: int, workers: int) -> float:
    """Step time once building a batch (``load`` s) overlaps the rest of the step (``rest`` s)
    in ``workers`` processes on ``cores`` cores."""
    return max(rest, load / max(workers, 1), (load + rest) / max(cores, 1), 1e-9)


def main_loader(loaders: pd.DataFrame | None) -> dict[str, Any]:
    """The settings of the loader the job iterated (the first one recorded)."""
    if loaders is None or loaders.empty:
        return {}
    return {str(k): v for k, v in loaders.iloc[0].to_dict().items()}


def _severity(share: float) -> str:
    return "critical" if share >= 0.5 else "warning" if share >= 0.2 else "info"


@rule("input.wait", needs=("ledger",))
def input_wait(inputs: RuleInputs) -> list[Finding]:
    ledger = inputs.ledger
    assert ledger is not None
    wall = float(ledger["wall_s"].sum())
    wait = float(ledger["wait_s"].sum())
    if wall <= 0:
        raise RuleSkipped("no step time")
    share = wait / wall
    if share < MIN_SHARE:
        return []
    cores = int(inputs.meta.get("cores") or 1)
    loader = main_loader(inputs.loaders)
    workers = int(loader.get("num_workers") or 0)
    median_wall = float(ledger["wall_s"].median())
    median_wait = float(ledger["wait_s"].median())
    evidence: dict[str, Any] = {
        "input_wait_share": share, "median_wait_s": median_wait, "median_step_s": median_wall,
        "cores": cores, "num_workers": workers, "batch_size": loader.get("batch_size"),
        "persistent_workers": loader.get("persistent_workers"),
        "prefetch_factor": loader.get("prefetch_factor"),
    }
    fixes: list[Fix] = []
    speedup = None
    if workers == 0:
        k = suggested_workers(cores)
        est = estimate_with_workers(median_wait, median_wall - median_wait, cores, k)
        speedup = median_wall / est
        fixes.append(Fix(
            title=f"num_workers=0 on a {cores}-core machine: set num_workers={k}",
            why=(f"Batches are built in the training process, which waits {median_wait:.3g} s "
                 f"of each {median_wall:.3g} s step. Workers build the next batches while the "
                 f"model trains; {cores} cores bound the gain to about {speedup:.1f}x."),
            code=(f"loader = DataLoader(dataset, batch_size={loader.get('batch_size')}, "
                  f"num_workers={k},\n                    persistent_workers=True, "
                  "prefetch_factor=4)"),
        ))
    else:
        busy = _worker_busy_cores(inputs)
        free = cores - busy if busy is not None else None
        evidence["worker_busy_cores"] = busy
        if free is not None and free >= 1.0 and workers < 8:
            k = min(8, workers + int(free))
            est = estimate_with_workers(median_wall * workers, median_wall - median_wait, cores,
                                        k)
            speedup = median_wall / est
            fixes.append(Fix(
                title=f"num_workers={workers} with {free:.1f} idle cores: set num_workers={k}",
                why="The workers cannot keep up, and cores are idle: more workers load more "
                    "batches at once.",
                code=f"loader = DataLoader(dataset, num_workers={k}, persistent_workers=True)",
            ))
        else:
            fixes.append(Fix(
                title="Loading keeps every core busy: make each sample cheaper",
                why="More workers cannot help when the cores are saturated; cache work that "
                    "repeats every epoch, or move augmentation to the GPU.",
                code="# build the expensive part once and cache it\n"
                     "cache = [dataset[i] for i in range(len(dataset))]",
            ))
        if not loader.get("persistent_workers"):
            fixes.append(Fix(
                title="persistent_workers=False: keep workers between epochs",
                why="Each epoch otherwise starts its workers again, a stall at every epoch.",
                code=f"DataLoader(dataset, num_workers={workers}, persistent_workers=True)",
            ))
    evidence["split"] = "not measured yet: all input wait counts as preprocess"
    return [Finding(
        id="input.split_pending", category="preprocess", severity=_severity(share),
        title=f"The training loop waits for input {share:.0%} of the time",
        evidence=evidence, fixes=tuple(fixes), estimated_speedup=speedup,
    )]


def _worker_busy_cores(inputs: RuleInputs) -> float | None:
    host = inputs.host
    pids = inputs.meta.get("worker_pids") or []
    if host is None or host.empty or not pids:
        return None
    per_pid = host[host["pid"].isin(pids)].groupby("pid")["cpu_pct"].mean()
    return float(per_pid.sum() / 100.0) if len(per_pid) else None
