"""Rules over NVML's counters for the whole run (doctor.analyse.gpus): a GPU starved by its
input or its host, ranks sharing one GPU while others idle, throttled clocks.

They read ``gpus`` (the counters, per GPU, and each rank's GPU) and the ledger's analysed steps;
the profiler window, where there is one, has finer rules of its own (doctor.rules.gpu).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from statistics import fmean
from typing import Any

import pandas as pd

from doctor.analyse.evidence import Evidence
from doctor.analyse.gpus import GpuSummary
from doctor.categories import INPUT_PIPELINE, INPUT_STAGES, UNSPLIT_INPUT
from doctor.rules.base import rule
from doctor.rules.gpu import COMPILE_REDUCE_OVERHEAD, LARGER_BATCH
from doctor.rules.input_model import main_loader
from doctor.rules.window import severity, speedup
from doctor.verdict import SEVERITIES, Finding, Fix

STARVED_IDLE = 0.3  # the GPU idle this much of the analysed time ...
STARVED_INPUT = 0.2  # ... while the training process waited for input this much of its steps
HOST_BOUND_IDLE = 0.4  # idle this much with little input wait: the host cannot feed it
THROTTLED_SHARE = 0.2  # samples with power or thermal clock reasons set
SLOW_CLOCK = 0.85  # the SM clock while busy below this fraction of its maximum


def rank_ledger_shares(ev: Evidence, rank: int) -> tuple[float, float, dict[str, float]]:
    """(mean step seconds, input share, seconds per step of each input stage) of one rank."""
    ledger = ev.ledger if ev.ledger is not None else pd.DataFrame()
    mine = ledger[ledger["rank"] == rank] if not ledger.empty else ledger
    if mine.empty:
        return 0.0, 0.0, {}
    wall = float(mine["wall_s"].sum())
    stages = {c: float(mine[c].sum()) / len(mine) for c in INPUT_PIPELINE if c in mine}
    step = wall / len(mine)
    return step, sum(stages.values()) / step if step > 0 else 0.0, stages


def _gpu_name(g: GpuSummary) -> str:
    return f"GPU {g.index}" + (f" ({g.name})" if g.name else "")


@dataclass(frozen=True)
class _Idle:
    """One rank whose GPU idled: the rank's steps beside its GPU's counters."""

    rank: int
    gpu: GpuSummary
    step_s: float
    input_share: float
    stages: dict[str, float]

    @property
    def idle(self) -> float:
        return 1.0 - self.gpu.util


def _idle_ranks(ev: Evidence, skip: set[int] | None = None) -> list[_Idle]:
    assert ev.gpus is not None
    out = []
    for rank in sorted(ev.gpus.rank_gpu):
        g = ev.gpus.of_rank(rank)
        if g is None or math.isnan(g.util) or rank in (skip or set()):
            continue
        step, input_share, stages = rank_ledger_shares(ev, rank)
        if step > 0:
            out.append(_Idle(rank, g, step, input_share, stages))
    return out


def _who(found: list[_Idle]) -> tuple[str, str, str]:
    """("<the GPU or GPUs> idle(s)", "<the rank or ranks> wait(s)", "it" or "them"): the
    findings' titles, in the singular for one rank, else in the plural."""
    if len(found) == 1:
        return f"{_gpu_name(found[0].gpu)} idles", f"rank {found[0].rank} waits", "it"
    return f"The GPUs of {len(found)} ranks idle", "the ranks wait", "them"


def _idle_evidence(found: list[_Idle]) -> dict[str, Any]:
    return dict(ranks=[f.rank for f in found], gpus=[f.gpu.index for f in found],
                gpu_idle_share=fmean(f.idle for f in found),
                gpu_idle_share_max=max(f.idle for f in found),
                input_share=fmean(f.input_share for f in found),
                samples=sum(f.gpu.samples for f in found),
                step_s=fmean(f.step_s for f in found))


@rule("gpu.starved", needs=("gpus", "ledger"))
def starved(ev: Evidence) -> list[Finding]:
    """The GPU idle while its rank waits for input: input-bound over the whole run."""
    found = [f for f in _idle_ranks(ev)
             if f.idle >= STARVED_IDLE and f.input_share >= STARVED_INPUT]
    if not found:
        return []
    totals: dict[str, float] = {}
    for f in found:
        for stage, seconds in f.stages.items():
            totals[stage] = totals.get(stage, 0.0) + seconds
    split = {k: v for k, v in totals.items() if k in INPUT_STAGES and v > 0}
    stage = max(split, key=lambda k: split[k]) if split else UNSPLIT_INPUT
    workers = main_loader(ev.loaders).get("num_workers")
    evidence = _idle_evidence(found)
    idle, share, step = evidence["gpu_idle_share"], evidence["input_share"], evidence["step_s"]
    gpus_idle, ranks_wait, _ = _who(found)
    return [Finding(
        id="gpu.starved", category=stage, severity=severity(min(idle, share), 0.5, 0.3),
        title=(f"{gpus_idle} {idle:.0%} of the run while {ranks_wait} for input {share:.0%} "
               "of each step"),
        evidence={**evidence, "input_stage": stage},
        fixes=(Fix(
            title="Feed the GPU: fix the input stage the findings above name",
            why=(f"the GPU waits with the training process: the loading ({stage}) is what "
                 "holds it; the input findings size each fix" +
                 (f" (the loader has num_workers={workers})" if workers is not None else "")),
            code=("loader = torch.utils.data.DataLoader(\n"
                  "    dataset, batch_size=batch_size, num_workers=num_workers,\n"
                  "    pin_memory=True, persistent_workers=True, prefetch_factor=4,\n"
                  ")"),
        ),),
        estimated_speedup=speedup(step, share * step),
    )]


@rule("gpu.host_bound", needs=("gpus", "ledger"))
def host_bound(ev: Evidence) -> list[Finding]:
    """The GPU idle while the training process is not waiting for input, on ranks the window did
    not profile (where it did, gpu.launch_bound and gpu.host_sync say which)."""
    windowed = set() if ev.window is None or ev.window.empty else set(ev.window["rank"])
    found = [f for f in _idle_ranks(ev, skip=windowed)
             if f.idle >= HOST_BOUND_IDLE and f.input_share < STARVED_INPUT]
    if not found:
        return []
    evidence = _idle_evidence(found)
    idle, share = evidence["gpu_idle_share"], evidence["input_share"]
    gpus_idle, ranks_wait, them = _who(found)
    return [Finding(
        id="gpu.host_bound", category="compute", severity=severity(idle, 0.6, 0.4),
        title=(f"{gpus_idle} {idle:.0%} of the run though {ranks_wait} for input only "
               f"{share:.0%} of the step: the host does not feed {them}"),
        evidence={**evidence, "main_cpu_cores": ev.main_cpu_cores},
        fixes=(Fix(title="Record the profiler window to see what the host does",
                   why="kernel launches, host syncs (.item(), .cpu()) and Python between "
                       "kernels all leave the GPU idle; the window tells them apart",
                   code="doctor run --window 10,5 train.py"),
               LARGER_BATCH, COMPILE_REDUCE_OVERHEAD),
    )]


@rule("gpu.shared", needs=("gpus",))
def shared(ev: Evidence) -> list[Finding]:
    """Two or more ranks on one GPU (every rank on cuda:0 is the common case)."""
    assert ev.gpus is not None
    by_gpu: dict[tuple[int, int], list[int]] = {}
    for rank, key in ev.gpus.rank_gpu.items():
        by_gpu.setdefault(key, []).append(rank)
    crowded = {k: sorted(v) for k, v in by_gpu.items() if len(v) > 1}
    if not crowded:
        return []
    unused = ev.gpus.unused()
    out = []
    for (node, index), ranks in sorted(crowded.items()):
        g = ev.gpus.gpu((node, index))
        if g is None:  # mapped to a GPU with no samples in the analysed span
            continue
        free = [u.index for u in unused if u.node == node]
        names = ", ".join(str(r) for r in ranks)
        where = f"; GPU{'s' if len(free) > 1 else ''} {', '.join(map(str, free))} " \
                "stayed idle" if free else ""
        out.append(Finding(
            id="gpu.shared", category="compute",
            severity="critical" if free else "warning",
            title=f"Ranks {names} all run on {_gpu_name(g)}{where}",
            evidence=dict(node=node, gpu=index, ranks=ranks, idle_gpus=free,
                          gpu_util=g.util, memory_used_max_bytes=g.mem_used_max_bytes,
                          mapped_by=ev.gpus.mapped_by),
            fixes=(Fix(
                title="One GPU per rank: set the device from LOCAL_RANK",
                why=f"{len(ranks)} ranks take turns on one GPU and each holds its own copy of "
                    "the model there; torchrun gives each rank LOCAL_RANK",
                code=("local_rank = int(os.environ[\"LOCAL_RANK\"])\n"
                      "torch.cuda.set_device(local_rank)\n"
                      "device = torch.device(\"cuda\", local_rank)\n"
                      "model = DDP(model.to(device), device_ids=[local_rank])"),
            ),),
            estimated_speedup=float(min(len(ranks), len(free) + 1)) if free else None,
        ))
    return out


@rule("gpu.idle_gpus", needs=("gpus",))
def idle_gpus(ev: Evidence) -> list[Finding]:
    """GPUs of the job's machines that nothing used all run, when no ranks share a GPU."""
    assert ev.gpus is not None
    if len(set(ev.gpus.rank_gpu.values())) < len(ev.gpus.rank_gpu):
        return []  # gpu.shared says it, with the idle ones
    unused = ev.gpus.unused()
    if not unused or not ev.gpus.rank_gpu:
        return []
    nodes = sorted({u.node for u in unused})
    used = {n: len({k for k in ev.gpus.rank_gpu.values() if k[0] == n}) for n in nodes}
    idle = {n: [u.index for u in unused if u.node == n] for n in nodes}
    per_node = max(used[n] + len(idle[n]) for n in nodes)
    count = sum(len(v) for v in idle.values())

    def gpus(indices: list[int]) -> str:
        return f"GPU{'s' if len(indices) > 1 else ''} {', '.join(map(str, indices))}"

    where = gpus(idle[nodes[0]]) if len(nodes) == 1 else \
        "; ".join(f"node {n}: {gpus(idle[n])}" for n in nodes)
    title = (f"{count} of the machine's {per_node} GPUs stayed idle the whole run ({where})"
             if len(nodes) == 1 and len({g.node for g in ev.gpus.gpus}) == 1 else
             f"{count} GPUs stayed idle the whole run ({where})")
    return [Finding(
        id="gpu.idle_gpus", category="compute", severity="info", title=title,
        evidence=dict(idle_gpus=idle[nodes[0]] if len(nodes) == 1 else
                      {str(n): idle[n] for n in nodes},
                      gpus_used=sum(used.values()), gpus_per_node=per_node),
        fixes=(Fix(
            title=f"Run one rank per GPU: torchrun --nproc-per-node {per_node}",
            why="data parallel over every GPU of the machine; if the idle GPUs are kept for "
                "something else, CUDA_VISIBLE_DEVICES hides them from the job",
            code=f"torchrun --nproc-per-node {per_node} train.py",
        ),),
    )]


def _throttle_fix(g: GpuSummary, cause: str) -> tuple[Fix, ...]:
    """What to do about the clocks of ``g``, held down by ``cause`` (thermal, power, clocks)."""
    if cause == "thermal":
        return (Fix(title="Cool the GPU",
                    why="the board slows its clocks to stay under its temperature limit "
                        f"(hottest {g.temp_max_c:.0f} C); check airflow, fans and the "
                        "data centre's inlet temperature",
                    code="nvidia-smi -q -d PERFORMANCE,TEMPERATURE"),)
    if cause == "power":
        lowered = g.power_limit_w < 0.95 * g.power_limit_max_w
        if not lowered:
            return ()  # at the board's own maximum: the work draws all the power it may
        return (Fix(title=f"Raise the power limit: {g.power_limit_w:.0f} W of the board's "
                          f"{g.power_limit_max_w:.0f} W",
                    why=f"the limit was set below the board's maximum and the GPU draws "
                        f"{g.power_w:.0f} W on average, against it; an administrator can raise it",
                    code=f"sudo nvidia-smi -i {g.index} -pl {g.power_limit_max_w:.0f}"),)
    return (Fix(title="Check the clocks set on the GPU",
                why="no power or thermal limit held the clocks down: application clocks or "
                    "locked clocks (nvidia-smi -lgc) keep the SM below its maximum",
                code=f"nvidia-smi -i {g.index} -q -d CLOCK\n"
                     f"sudo nvidia-smi -i {g.index} -rgc  # reset locked clocks"),)


@rule("gpu.throttled", needs=("gpus",))
def throttled(ev: Evidence) -> list[Finding]:
    """Clocks held below their maximum while the job ran: by temperature, by a power limit, or
    by clocks set low. A board at its own maximum power limit that holds its clocks there is
    working as built: said (info), with nothing to set."""
    assert ev.gpus is not None
    out = []
    for g in ev.gpus.gpus:
        if not g.ranks:
            continue
        power, thermal, share = _zero(g.power_throttled), _zero(g.thermal_throttled), g.held_share
        ratio = g.clock_ratio
        slow = not math.isnan(ratio) and ratio < SLOW_CLOCK
        if share < THROTTLED_SHARE and not slow:
            continue
        cause = ("clocks" if share < THROTTLED_SHARE else
                 "thermal" if thermal >= power else "power")
        fixes = _throttle_fix(g, cause)
        clocks = f", SM clock {ratio:.0%} of its maximum while busy" if not math.isnan(ratio) \
            else ""
        if cause == "clocks":
            title = f"{_gpu_name(g)} ran at {ratio:.0%} of its maximum SM clock while busy"
        elif cause == "power" and not fixes:
            title = (f"{_gpu_name(g)} ran at its power limit ({g.power_limit_w:.0f} W, the "
                     f"board's maximum) {share:.0%} of the run{clocks}")
        else:
            title = f"{_gpu_name(g)} ran {cause}-throttled {share:.0%} of the run{clocks}"
        severe = (share >= 0.5 or (slow and ratio < 0.7)) and bool(fixes)
        out.append(Finding(
            id="gpu.throttled", category="compute", severity="warning" if severe else "info",
            title=title,
            evidence=dict(gpu=g.index, ranks=list(g.ranks), cause=cause,
                          power_throttled_share=power, thermal_throttled_share=thermal,
                          hw_slowdown_share=_zero(g.hw_slowdown), sm_clock_mhz=g.sm_clock_mhz,
                          sm_clock_max_mhz=g.sm_clock_max_mhz, power_w=g.power_w,
                          power_limit_w=g.power_limit_w, power_limit_max_w=g.power_limit_max_w,
                          temperature_max_c=g.temp_max_c),
            fixes=fixes,
        ))
    if len(out) <= 1:
        return out
    # one finding for the machine: the worst GPU's, naming the others
    worst = min(out, key=lambda f: (SEVERITIES.index(f.severity), -max(
        f.evidence["power_throttled_share"], f.evidence["thermal_throttled_share"])))
    gpus = [int(f.evidence["gpu"]) for f in out]
    return [replace(worst, title=f"{len(out)} GPUs held down; the worst: {worst.title}",
                    evidence={**worst.evidence, "throttled_gpus": gpus})]


def _zero(value: float) -> float:
    return 0.0 if math.isnan(value) else value
