"""Rules over NVML's counters for the whole run (doctor.analyse.gpus): a GPU starved by its
input or its host, ranks sharing one GPU while others idle, throttled clocks.

They read ``gpus`` (the counters, per GPU, and each rank's GPU) and the ledger's analysed steps;
the profiler window, where there is one, has finer rules of its own (doctor.rules.gpu).
"""

from __future__ import annotations

import math

import pandas as pd

from doctor.analyse.gpus import GpuSummary
from doctor.categories import INPUT_PIPELINE, INPUT_STAGES, UNSPLIT_INPUT
from doctor.rules.base import rule
from doctor.rules.evidence import Evidence
from doctor.rules.gpu import COMPILE_REDUCE_OVERHEAD, LARGER_BATCH
from doctor.rules.input_model import main_loader
from doctor.rules.window import severity, speedup
from doctor.verdict import Finding, Fix

STARVED_IDLE = 0.3  # the GPU idle this much of the analysed time ...
STARVED_INPUT = 0.2  # ... while the training process waited for input this much of its steps
HOST_BOUND_IDLE = 0.4  # idle this much with little input wait: the host cannot feed it
THROTTLED_SHARE = 0.2  # samples with power or thermal clock reasons set
SLOW_CLOCK = 0.85  # the SM clock while busy below this fraction of its maximum


def _ledger_shares(ev: Evidence, rank: int) -> tuple[float, float, dict[str, float]]:
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


@rule("gpu.starved", needs=("gpus", "ledger"))
def starved(ev: Evidence) -> list[Finding]:
    assert ev.gpus is not None
    out = []
    for rank in sorted(ev.gpus.rank_gpu):
        g = ev.gpus.of_rank(rank)
        if g is None or math.isnan(g.util):
            continue
        step, input_share, stages = _ledger_shares(ev, rank)
        idle = 1.0 - g.util
        if idle < STARVED_IDLE or input_share < STARVED_INPUT:
            continue
        split = {k: v for k, v in stages.items() if k in INPUT_STAGES and v > 0}
        stage = max(split, key=lambda k: split[k]) if split else UNSPLIT_INPUT
        loader = main_loader(ev.loaders)
        workers = loader.get("num_workers")
        fix = Fix(
            title="Feed the GPU: fix the input stage the findings above name",
            why=(f"the GPU waits with the training process: the loading ({stage}) is what "
                 "holds it; the input findings size each fix" +
                 (f" (the loader has num_workers={workers})" if workers is not None else "")),
            code=("loader = torch.utils.data.DataLoader(\n"
                  "    dataset, batch_size=batch_size, num_workers=num_workers,\n"
                  "    pin_memory=True, persistent_workers=True, prefetch_factor=4,\n"
                  ")"),
        )
        out.append(Finding(
            id="gpu.starved", category=stage,
            severity=severity(min(idle, input_share), 0.5, 0.3),
            title=(f"{_gpu_name(g)} idles {idle:.0%} of the run while rank {rank} waits for "
                   f"input {input_share:.0%} of each step"),
            evidence=dict(rank=rank, gpu=g.index, gpu_util=g.util, gpu_idle_share=idle,
                          input_share=input_share, input_stage=stage, samples=g.samples,
                          step_s=step),
            fixes=(fix,), estimated_speedup=speedup(step, input_share * step),
        ))
    return out


@rule("gpu.host_bound", needs=("gpus", "ledger"))
def host_bound(ev: Evidence) -> list[Finding]:
    """The GPU idle while the training process is not waiting for input, on a rank the window did
    not profile (where it did, gpu.launch_bound and gpu.host_sync say which)."""
    assert ev.gpus is not None
    windowed = set() if ev.window is None or ev.window.empty else set(ev.window["rank"])
    out = []
    for rank in sorted(ev.gpus.rank_gpu):
        g = ev.gpus.of_rank(rank)
        if rank in windowed or g is None or math.isnan(g.util):
            continue
        step, input_share, _ = _ledger_shares(ev, rank)
        idle = 1.0 - g.util
        if idle < HOST_BOUND_IDLE or input_share >= STARVED_INPUT:
            continue
        out.append(Finding(
            id="gpu.host_bound", category="compute", severity=severity(idle, 0.6, 0.4),
            title=(f"{_gpu_name(g)} idles {idle:.0%} of the run though rank {rank} waits for "
                   f"input only {input_share:.0%} of the step: the host does not feed it"),
            evidence=dict(rank=rank, gpu=g.index, gpu_util=g.util, gpu_idle_share=idle,
                          input_share=input_share, main_cpu_cores=ev.main_cpu_cores,
                          step_s=step),
            fixes=(Fix(title="Record the profiler window to see what the host does",
                       why="kernel launches, host syncs (.item(), .cpu()) and Python between "
                           "kernels all leave the GPU idle; the window tells them apart",
                       code="doctor run --window 10,5 train.py"),
                   LARGER_BATCH, COMPILE_REDUCE_OVERHEAD),
        ))
    return out


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
        g = next(x for x in ev.gpus.gpus if x.key == (node, index))
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
    """GPUs of the job's machine that nothing used all run, when no ranks share a GPU."""
    assert ev.gpus is not None
    if len(set(ev.gpus.rank_gpu.values())) < len(ev.gpus.rank_gpu):
        return []  # gpu.shared says it, with the idle ones
    unused = ev.gpus.unused()
    if not unused or not ev.gpus.rank_gpu:
        return []
    used = len(set(ev.gpus.rank_gpu.values()))
    total = used + len(unused)
    return [Finding(
        id="gpu.idle_gpus", category="compute", severity="info",
        title=(f"{len(unused)} of the machine's {total} GPUs stayed idle the whole run "
               f"(GPU{'s' if len(unused) > 1 else ''} {', '.join(str(u.index) for u in unused)})"),
        evidence=dict(idle_gpus=[u.index for u in unused], gpus_used=used, gpus=total),
        fixes=(Fix(
            title=f"Run one rank per GPU: torchrun --nproc-per-node {total}",
            why="data parallel over every GPU of the machine; if the idle GPUs are kept for "
                "something else, CUDA_VISIBLE_DEVICES hides them from the job",
            code=f"torchrun --nproc-per-node {total} train.py",
        ),),
    )]


@rule("gpu.throttled", needs=("gpus",))
def throttled(ev: Evidence) -> list[Finding]:
    assert ev.gpus is not None
    out = []
    for g in ev.gpus.gpus:
        if not g.ranks:
            continue
        power, thermal = _zero(g.power_throttled), _zero(g.thermal_throttled)
        ratio = g.clock_ratio
        slow = not math.isnan(ratio) and ratio < SLOW_CLOCK
        if max(power, thermal) < THROTTLED_SHARE and not slow:
            continue
        cause = "thermal" if thermal >= power else "power"
        share = max(power, thermal)
        clocks = f", SM clock {ratio:.0%} of its maximum while busy" if not math.isnan(ratio) \
            else ""
        fix = (Fix(title="Cool the GPU",
                   why="the board slows its clocks to stay under its temperature limit "
                       f"(hottest {g.temp_max_c:.0f} C); check airflow, fans and the "
                       "data centre's inlet temperature",
                   code="nvidia-smi -q -d PERFORMANCE,TEMPERATURE")
               if cause == "thermal" else
               Fix(title="Check the power limit",
                   why=f"the board holds its clocks under its power limit "
                       f"({g.power_limit_w:.0f} W, drawing {g.power_w:.0f} W on average); an "
                       "administrator can raise it up to the board's maximum",
                   code="nvidia-smi -q -d POWER  # then: sudo nvidia-smi -pl <watts>"))
        out.append(Finding(
            id="gpu.throttled", category="compute",
            severity="warning" if share >= 0.5 or (slow and ratio < 0.7) else "info",
            title=(f"{_gpu_name(g)} ran {cause}-throttled {share:.0%} of the run{clocks}"
                   if share >= THROTTLED_SHARE else
                   f"{_gpu_name(g)} ran at {ratio:.0%} of its maximum SM clock while busy"),
            evidence=dict(gpu=g.index, ranks=list(g.ranks), power_throttled_share=power,
                          thermal_throttled_share=thermal, hw_slowdown_share=_zero(g.hw_slowdown),
                          sm_clock_mhz=g.sm_clock_mhz, sm_clock_max_mhz=g.sm_clock_max_mhz,
                          power_w=g.power_w, power_limit_w=g.power_limit_w,
                          temperature_max_c=g.temp_max_c),
            fixes=(fix,),
        ))
    return out


def _zero(value: float) -> float:
    return 0.0 if math.isnan(value) else value
