"""The verdict of ``doctor report TRACE [TRACE ...]``: torch.profiler traces analysed on their own.

Each file is one rank; their steps are pooled. Shares are the exclusive seconds of
doctor.trace.shares over the analysed steps of every rank. A trace has no view of the loading
code, so DataLoader wait stays one ``input`` share (``io``, ``decode`` and ``preprocess`` are 0)
and a finding says that ``doctor run`` would split it.

Which category is the bottleneck (``choose_bottleneck``). Compute is the work itself; the other
categories are stalls, and they differ in what a healthy job shows:

- ``input`` and ``transfer`` can be hidden completely (loader workers and prefetching, pinned
  memory with non-blocking copies), so when either costs at least ``STALL_SHARE`` (a fifth) of the
  step, removing it is worth 1.25x or more, and it is the bottleneck even if compute is larger;
- exposed ``communication`` is partly inherent to data-parallel training (the network bounds it),
  so it is the bottleneck when it costs at least ``STALL_SHARE`` of the step *and* at least as much
  as the compute it serves (the GPU's compute-kernel time; host ops on a CPU job);
- otherwise the largest category other than ``other`` is (on a GPU job nearly always compute,
  whose findings then say how to make it cheaper: launch overhead, Tensor Cores, syncs).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from doctor.rules import gpu as gpu_rules
from doctor.rules.base import RuleInputs, registered_rules, run_rules
from doctor.trace.events import load_timeline
from doctor.trace.reader import TraceMeta
from doctor.trace.shares import SHARE_CATEGORIES, category_seconds
from doctor.trace.steps import empty_step_frame, step_frame_from_timeline
from doctor.verdict import CATEGORIES, LEDGER_COLUMNS, Analysis, Finding, Fix, ProbeStatus, Verdict

__all__ = ["STALL_SHARE", "choose_bottleneck", "verdict_from_traces"]

STALL_SHARE = 0.20
#: A step shorter than this fraction of the median step is a fragment, not a step.
FRAGMENT = 0.05


def choose_bottleneck(shares: dict[str, float], device_compute_share: float) -> str:
    """The bottleneck for trace shares (policy in the module docstring).

    ``device_compute_share`` is the fraction of the step the device spends computing: GPU
    compute kernels on a GPU job, host ops on a CPU job.
    """
    hideable = {c: shares.get(c, 0.0) for c in ("input", "transfer")}
    worst = max(hideable, key=lambda c: hideable[c])
    if hideable[worst] >= STALL_SHARE:
        return worst
    comm = shares.get("communication", 0.0)
    if comm >= STALL_SHARE and comm >= device_compute_share:
        return "communication"
    ranked = {c: v for c, v in shares.items() if c != "other"}
    if not ranked or max(ranked.values()) <= 0:
        return "unknown"
    return max(ranked, key=lambda c: ranked[c])


def _mark_analyzed(frame: pd.DataFrame) -> pd.DataFrame:
    """Per rank: the first of three or more steps is warm-up; fragments are not analysed."""
    frame = frame.copy()
    warm = np.zeros(len(frame), dtype=bool)
    keep = np.ones(len(frame), dtype=bool)
    for _, idx in frame.groupby("rank").groups.items():
        pos = frame.index.get_indexer(idx)
        dur = frame["dur_s"].to_numpy()[pos]
        if pos.size >= 3:
            warm[pos[np.argmin(frame["start_us"].to_numpy()[pos])]] = True
        keep[pos] = dur >= FRAGMENT * float(np.median(dur))
    frame["warmup"] = warm
    frame["analyzed"] = keep & ~warm
    return frame


def _ledger(frame: pd.DataFrame) -> pd.DataFrame:
    if frame.empty:
        cols: dict[str, pd.Series[Any]] = {
            c: pd.Series(dtype="float64") for c in (*LEDGER_COLUMNS, "input")
        }
        return pd.DataFrame(cols)
    seconds = category_seconds(frame)
    t0 = float(frame["start_us"].min())
    ledger = pd.DataFrame({
        "rank": frame["rank"].astype("int64"),
        "step": frame["step"].astype("int64"),
        "start_s": (frame["start_us"] - t0) / 1e6,
        "wall_s": frame["dur_s"],
        "io": 0.0, "decode": 0.0, "preprocess": 0.0,
        "transfer": seconds["transfer"],
        "compute": seconds["compute"],
        "communication": seconds["communication"],
        "other": seconds["other"],
        "warmup": frame["warmup"].astype(bool),
        "analyzed": frame["analyzed"].astype(bool),
        "input": seconds["input"],
    })
    return ledger.reset_index(drop=True)


def _assign_ranks(metas: list[TraceMeta]) -> list[int]:
    ranks = [m.rank for m in metas]
    known = [r for r in ranks if r is not None]
    if len(known) == len(ranks) and len(set(known)) == len(known):
        return [int(r) for r in known]
    return list(range(len(metas)))  # missing or repeated ranks: number the files in order


def _input_finding(share: float, step_s: float) -> Finding:
    return Finding(
        id="input.unsplit", category="input", severity="critical" if share >= 0.2 else "warning",
        title=f"The step waits for the DataLoader {share:.0%} of the time",
        evidence={"input_share": share, "input_s_per_step": share * step_s, "step_s": step_s},
        fixes=(
            Fix(
                title="Let doctor split the wait",
                why="a trace cannot see inside the loading code; `doctor run -- python "
                    "train.py` splits this wait into io, decode and preprocess and names the fix",
                code="",
            ),
            Fix(
                title="Load batches in worker processes, ahead of the step",
                why="with num_workers=0 the main process loads every batch while the GPU waits",
                code=(
                    "loader = torch.utils.data.DataLoader(\n"
                    "    dataset, batch_size=batch_size, num_workers=4, pin_memory=True,\n"
                    "    persistent_workers=True, prefetch_factor=4,\n"
                    ")"
                ),
            ),
        ),
        estimated_speedup=1.0 / max(1.0 - share, 0.05),
    )


def _empty_analysis(paths: Sequence[Path], why: str, metas: list[TraceMeta]) -> Analysis:
    verdict = Verdict(
        bottleneck="unknown",
        shares=dict.fromkeys(CATEGORIES, 0.0),
        steps={"count": 0, "analyzed": 0, "median_s": None},
        findings=[Finding(
            id="trace.no_steps", category="other", severity="warning",
            title=f"Nothing to analyse: {why}",
            evidence={"files": len(paths)},
            fixes=(Fix(
                title="Record a few steps with prof.step()",
                why="doctor reads one step per ProfilerStep#N; call prof.step() once per "
                    "training step inside the profiler",
                code=(
                    "with torch.profiler.profile(schedule=torch.profiler.schedule("
                    "wait=1, warmup=1, active=5)) as prof:\n"
                    "    for batch in loader:\n"
                    "        train_step(batch)\n"
                    "        prof.step()"
                ),
            ),),
        )],
        probes={"trace": ProbeStatus(False, why)},
        job=_job(metas, 0, "unknown"),
    )
    return Analysis(verdict, _ledger(empty_step_frame()), _source(paths))


def _job(metas: list[TraceMeta], ranks: int, device: str) -> dict[str, Any]:
    worlds = [m.world_size for m in metas if m.world_size is not None]
    return {"argv": [], "exit_code": None, "ranks": ranks, "device": device,
            "world_size": max(worlds) if worlds else None}


def _source(paths: Sequence[Path]) -> str:
    return ", ".join(str(p) for p in paths)


def verdict_from_traces(paths: Sequence[str | Path]) -> Analysis:
    """Analyse one torch.profiler trace per rank; raises doctor.trace.TraceError if unreadable."""
    files = [Path(p) for p in paths]
    timelines = [load_timeline(p) for p in files]
    metas = [t.meta for t in timelines]
    ranks = _assign_ranks(metas)
    frames = [step_frame_from_timeline(t, r) for t, r in zip(timelines, ranks, strict=True)]
    frames = [f for f in frames if not f.empty]
    if not frames:
        why = "the trace has no events" if all(t.last_us <= 0 for t in timelines) else (
            "no step could be found")
        return _empty_analysis(files, why, metas)
    frame = _mark_analyzed(pd.concat(frames, ignore_index=True))
    ledger = _ledger(frame)
    analysed = frame[frame["analyzed"]]
    seconds = category_seconds(analysed).sum()
    total = float(analysed["dur_s"].sum())
    if total <= 0:
        return _empty_analysis(files, "the steps have no duration", metas)
    device = "cuda" if (frame["device"] == "cuda").any() else "cpu"
    shares = {c: 0.0 for c in CATEGORIES}
    for c in SHARE_CATEGORIES:
        shares[c] = float(seconds[c]) / total
    if shares["input"] <= 0:
        del shares["input"]
    if device == "cuda":
        device_compute = float(analysed["kernel_s"].sum()) / total
    else:
        device_compute = shares["compute"]
    bottleneck = choose_bottleneck(shares, device_compute)

    meta: dict[str, Any] = {"device": device, **_job(metas, len(set(ranks)), device)}
    wanted = set(gpu_rules.GPU_RULE_IDS)
    outcome = run_rules(
        RuleInputs(gpu_steps=analysed, meta=meta),
        [r for r in registered_rules() if r.id in wanted],
    )
    findings = list(outcome.findings)
    step_s = float(analysed["dur_s"].mean())
    if shares.get("input", 0.0) >= 0.05 or bottleneck == "input":
        findings.insert(0, _input_finding(shares.get("input", 0.0), step_s))
    notes = [f"rule {rid} skipped: {why}" for rid, why in outcome.skipped.items()]
    boundaries = set(frame["boundary"])
    if boundaries - {"profiler_step"}:
        notes.append("no ProfilerStep#N in the trace: steps taken from "
                     + ", ".join(sorted(boundaries - {"profiler_step"})).replace("_", " "))
    if device == "cpu":
        findings.append(Finding(
            id="trace.cpu_only", category="compute", severity="info",
            title="No GPU activity in the trace: analysed as a CPU job",
            evidence={"gpu_events": 0},
            fixes=(Fix(
                title="Record the GPU too",
                why="kernels, copies and collectives only appear with the CUDA activity on",
                code="activities = [torch.profiler.ProfilerActivity.CPU, "
                     "torch.profiler.ProfilerActivity.CUDA]",
            ),),
        ))
    verdict = Verdict(
        bottleneck=bottleneck,
        shares=shares,
        steps={"count": len(frame), "analyzed": len(analysed),
               "median_s": float(analysed["dur_s"].median())},
        findings=findings,
        probes={"trace": ProbeStatus(True)},
        job=_job(metas, len(set(ranks)), device),
        notes=notes,
    )
    return Analysis(verdict, ledger, _source(files), tables={"gpu_steps": frame})
