"""GPU-side rules over the profiler window: copies, host syncs, launch overhead, Tensor Cores.

They read ``window`` (one row per profiled step, doctor.trace.steps.STEP_COLUMNS) of the evidence.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd

from doctor.analyse.evidence import Evidence
from doctor.analyse.precision import gpu_precision
from doctor.rules.base import rule
from doctor.rules.input_model import main_loader
from doctor.rules.window import mean, means, window_finding, window_steps
from doctor.verdict import Finding, Fix

MIB = 1 << 20


NON_BLOCKING = Fix(
    title="Copy without blocking the host",
    why="with pinned memory, non_blocking=True lets the copy overlap the previous "
        "step's kernels instead of stalling the stream",
    code=(
        "for inputs, targets in loader:\n"
        "    inputs = inputs.to(device, non_blocking=True)\n"
        "    targets = targets.to(device, non_blocking=True)"
    ),
)
PREFETCH_ON_A_STREAM = Fix(
    title="Copy the next batch while this one computes",
    why="a copy on its own stream, issued a step ahead, overlaps the kernels "
        "instead of running between them",
    code=(
        "copy_stream = torch.cuda.Stream()\n"
        "def prefetch(batch):\n"
        "    with torch.cuda.stream(copy_stream):\n"
        "        return [t.to(device, non_blocking=True) for t in batch]\n"
        "batches = iter(loader)\n"
        "nxt = prefetch(next(batches))\n"
        "for batch in batches:\n"
        "    torch.cuda.current_stream().wait_stream(copy_stream)\n"
        "    current, nxt = nxt, prefetch(batch)\n"
        "    train_step(current)"
    ),
)
KEEP_RESULTS_ON_GPU = Fix(
    title="Keep results on the GPU",
    why="device-to-host copies (.cpu(), .numpy(), .tolist()) inside the step wait "
        "for the GPU and cost a copy; gather metrics on the device",
    code="correct += (logits.argmax(dim=1) == targets).sum()  # read once per epoch",
)
FIND_SYNCS = Fix(
    title="Find the syncs",
    why="torch reports every synchronising call (.item(), .cpu(), printing a "
        "tensor, boolean masks, blocking copies) with its Python line",
    code='torch.cuda.set_sync_debug_mode("warn")',
)
READ_SCALARS_RARELY = Fix(
    title="Read scalars every N steps, not every step",
    why="loss.item() waits for the whole step to finish; keep the running value "
        "on the GPU and read it rarely",
    code=(
        "running_loss += loss.detach()\n"
        "if step % 100 == 0:\n"
        "    print(f\"loss {running_loss.item() / 100:.4f}\")\n"
        "    running_loss.zero_()"
    ),
)
LARGER_BATCH = Fix(
    title="Fewer, larger kernels: a larger batch",
    why="each launch costs the host microseconds whatever the kernel's size; a "
        "larger batch does more work per launch (scale the learning rate with it)",
    code="loader = torch.utils.data.DataLoader(dataset, batch_size=2 * batch_size)",
)
COMPILE_REDUCE_OVERHEAD = Fix(
    title="Compile the model (fusion, and CUDA graphs with reduce-overhead)",
    why="torch.compile fuses elementwise kernels; mode='reduce-overhead' replays "
        "the step as a CUDA graph, one launch instead of thousands",
    code='model = torch.compile(model, mode="reduce-overhead")',
)
FUSED_OPTIMIZER = Fix(
    title="Fused optimizer",
    why="the foreach/fused implementations update all parameters in a few kernels",
    code="optimizer = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)",
)
ALLOW_TF32 = Fix(
    title="Allow TF32 for fp32 matmuls and convolutions",
    why="on Ampere and later, TF32 keeps fp32 storage and runs on Tensor Cores; "
        "one line, no other code change",
    code=(
        "torch.backends.cuda.matmul.allow_tf32 = True\n"
        "torch.backends.cudnn.allow_tf32 = True"
    ),
    apply={"torch": {"allow_tf32": True}},
)


@rule("gpu.pageable_copy", needs=("window",))
def pageable_copy(ev: Evidence) -> list[Finding]:
    f = window_steps(ev)
    pageable, step, exposed, htod = means(f, "htod_pageable_count", "dur_s",
                                          "transfer_exposed_s", "htod_s")
    if pageable <= 0:
        return []
    share = exposed / step
    pin = main_loader(ev.loaders).get("pin_memory")
    why_pin = (
        "the DataLoader already has pin_memory=True, so these copies come from tensors made "
        "outside it: pin them with tensor.pin_memory() or keep them on the GPU"
        if pin else
        "pageable host memory is staged through a bounce buffer and blocks the host; pinned "
        "batches copy by DMA and can overlap compute"
    )
    return [window_finding(
        "gpu.pageable_copy", "transfer", share=share, bands=(0.15, 0.03),
        title=f"{pageable:.0f} host-to-device copies per step come from pageable memory",
        evidence=dict(htod_pageable_per_step=pageable,
                      htod_pinned_per_step=mean(f, "htod_pinned_count"), htod_s_per_step=htod,
                      htod_mb_per_step=mean(f, "htod_bytes") / MIB,
                      transfer_exposed_s_per_step=exposed, transfer_exposed_share=share),
        fixes=(
            Fix(
                title="Pin the DataLoader's batches",
                why=why_pin,
                code=(
                    "loader = torch.utils.data.DataLoader(\n"
                    "    dataset, batch_size=batch_size, num_workers=num_workers,\n"
                    "    pin_memory=True,\n"
                    ")"
                ),
                apply=None if pin or ev.loaders is None or ev.loaders.empty
                else {"dataloader": {"pin_memory": True}},
            ),
            NON_BLOCKING,
        ),
        step_s=step, removed_s=exposed,
    )]


@rule("gpu.transfer_exposed", needs=("window",))
def transfer_exposed(ev: Evidence) -> list[Finding]:
    f = window_steps(ev)
    step, total, exposed = means(f, "dur_s", "transfer_s", "transfer_exposed_s")
    if mean(f, "htod_pageable_count") > 0 or total / step < 0.05 or exposed / step < 0.01:
        return []  # pageable copies have their own finding; small copies cost nothing
    return [window_finding(
        "gpu.transfer_exposed", "transfer", share=exposed / step, bands=(0.15, 0.05),
        title=(
            f"Host-device copies take {total / step:.0%} of the step, {exposed / step:.0%} "
            "with no kernel running beside them"
        ),
        evidence=dict(transfer_s_per_step=total, transfer_share=total / step,
                      transfer_exposed_share=exposed / step,
                      overlapped_fraction=1.0 - exposed / total if total > 0 else 0.0,
                      htod_mb_per_step=mean(f, "htod_bytes") / MIB,
                      htod_pinned_per_step=mean(f, "htod_pinned_count")),
        fixes=(PREFETCH_ON_A_STREAM, KEEP_RESULTS_ON_GPU),
        step_s=step, removed_s=exposed,
    )]


@rule("gpu.host_sync", needs=("window",))
def host_sync(ev: Evidence) -> list[Finding]:
    f = window_steps(ev)
    count, bubble, step = means(f, "sync_count", "sync_bubble_s", "dur_s")
    share = bubble / step
    if count <= 0 or share < 0.01:
        return []
    sources = [s for s in f["sync_source"].astype(str) if s] if "sync_source" in f else []
    source = max(set(sources), key=sources.count) if sources else ""
    where = f" (most of them: {source})" if source else ""
    return [window_finding(
        "gpu.host_sync", "compute", share=share, bands=(0.15, 0.03),
        title=f"{_sync_rate(count)} drain the GPU queue{where}",
        evidence=dict(syncs_per_step=count, sync_s_per_step=mean(f, "sync_s"),
                      gpu_idle_after_sync_s_per_step=bubble, gpu_idle_after_sync_share=share,
                      source=source),
        fixes=(FIND_SYNCS, READ_SCALARS_RARELY),
        step_s=step, removed_s=bubble,
    )]


#: Below this many launch calls per kernel, the kernels were replayed from CUDA graphs (one
#: cudaGraphLaunch runs thousands): the fix gpu.launch_bound offers is already in place.
GRAPHED = 0.1


def _sync_rate(per_step: float) -> str:
    """'3 host syncs per step', '1 host sync per step', '1 host sync every 5 steps'."""
    if per_step < 0.95:
        return f"1 host sync every {1 / per_step:.0f} steps"
    n = round(per_step)
    return f"{n} host sync{'s' if n != 1 else ''} per step"


@rule("gpu.launch_bound", needs=("window",))
def launch_bound(ev: Evidence) -> list[Finding]:
    f = window_steps(ev)
    step, idle_host, kernels, median_us = means(f, "dur_s", "gpu_idle_host_s", "kernel_count",
                                                "kernel_median_us")
    share = idle_host / step
    if share < 0.2 or kernels < 50:
        return []
    if 0 < mean(f, "launch_count") < GRAPHED * kernels:
        return []  # the kernels come from CUDA graphs: the host does not launch them one by one
    # the window's steps run slower (the profiler's own cost on the host): the gain is at most
    # the GPU's idle over the whole run, where NVML measured it
    idle_run = _nvml_idle(ev, f)
    removed = min(idle_host, idle_run * step) if idle_run is not None else idle_host
    return [window_finding(
        "gpu.launch_bound", "compute", share=share, bands=(0.4, 0.2),
        title=(
            f"The GPU idles {share:.0%} of the step while the host launches work "
            f"({kernels:.0f} kernels per step, median {median_us:.0f} us)"
        ),
        evidence=dict(gpu_busy_share=mean(f, "gpu_busy_s") / step, gpu_idle_host_share=share,
                      kernels_per_step=kernels, kernel_median_us=median_us,
                      launches_per_step=mean(f, "launch_count")),
        fixes=(LARGER_BATCH, COMPILE_REDUCE_OVERHEAD, FUSED_OPTIMIZER),
        step_s=step, removed_s=removed,
    )]


def _nvml_idle(ev: Evidence, frame: pd.DataFrame) -> float | None:
    """The share of the run NVML saw the window's rank's GPU idle (None: not measured)."""
    if ev.gpus is None or "rank" not in frame or frame.empty:
        return None
    gpu = ev.gpus.of_rank(int(frame["rank"].iloc[0]))
    if gpu is None or math.isnan(gpu.util):
        return None
    return max(0.0, 1.0 - gpu.util)


@rule("gpu.no_tensor_cores", needs=("window",))
def no_tensor_cores(ev: Evidence) -> list[Finding]:
    f = window_steps(ev)
    gemm, tc, busy, step = means(f, "gemm_s", "gemm_tensor_core_s", "gpu_busy_s", "dur_s")
    cc = float(f["gpu_cc"].iloc[0]) if "gpu_cc" in f else float("nan")
    name = str(f["gpu_name"].iloc[0]) if "gpu_name" in f else ""
    if busy <= 0 or gemm / busy < 0.2 or tc > 0.1 * gemm:
        return []
    if not math.isnan(cc) and cc < 7.0:
        return []  # no Tensor Cores on this GPU
    if "amd" in name.lower() or "radeon" in name.lower() or "instinct" in name.lower():
        return []  # ROCm kernel names do not say whether matrix cores ran
    tf32 = math.isnan(cc) or cc >= 8.0
    # Tensor Cores run fp32-shaped GEMMs 2x-8x faster: count on halving GEMM time.
    gained = 0.5 * min(gemm, mean(f, "kernel_s") or gemm)
    # the 16-bit type this GPU runs fast (tf32: compute capability 8.0 or newer, or unknown)
    precision = gpu_precision(None if math.isnan(cc) else cc)
    fixes = [] if ev.job.autocasts_on("cuda") is not None or precision.dtype is None else [
        Fix(title=f"Mixed precision ({precision.short} autocast)",
            why=f"matrix multiplies and convolutions in {precision.short} run on Tensor Cores "
                f"({precision.why})",
            code=precision.autocast_code("loss = loss_fn(model(inputs), targets)"))]
    if tf32:
        fixes.append(replace(ALLOW_TF32, estimated_speedup=step / max(step - gained, 1e-9)))
    return [window_finding(
        "gpu.no_tensor_cores", "compute", share=gemm / step, bands=(0.4, 0.15),
        title=f"GEMM/convolution kernels take {gemm / busy:.0%} of GPU time without Tensor Cores",
        evidence=dict(gemm_s_per_step=gemm, gemm_share_of_gpu_busy=gemm / busy,
                      tensor_core_share_of_gemm=tc / gemm if gemm else 0.0, compute_capability=cc,
                      gpu=name),
        fixes=tuple(fixes),
        step_s=step, removed_s=gained,
    )]
