"""Op rules over the roofline classes (doctor.analyse.ops): which ops to attack, with what, and
the step speedup each fix would give, estimated from the class.

- memory-bound elementwise and normalisation ops: fusing them (``torch.compile``) keeps the
  intermediates of a chain in registers; fused in pairs, half of their bytes stay unmoved, so
  half of their time is the estimate;
- fp32 matrix maths on a machine whose 16-bit (or TF32) roof is higher: autocast (or TF32),
  the GEMMs' time scaled by the ratio of the roofs;
- launch-bound ops (calls too short for their work to matter): CUDA graphs or a larger batch on
  a GPU, fewer and larger ops (``torch.compile``) on a CPU; half their time is the estimate;
- convolutions on NCHW tensors on a GPU whose Tensor Cores run them NHWC: ``channels_last``.
  Where cuDNN transposes the tensors to NHWC and back (its ``nchwToNhwc`` kernels), their time
  is the estimate; where only the strides show NCHW inputs in 16 bits (or TF32), there is no
  measured estimate and the finding says to try it.

Each estimate is the step with that time taken out of the compute share the ledger measured.
The fusing and launch findings leave out the time those ops spend in an optimizer's step
(``opt_share``): an unfused Adam's elementwise ops are the optimizer's cost, which
``optimizer.unfused`` fixes with foreach or fused, never torch.compile of the model.
"""

from __future__ import annotations

import pandas as pd

from doctor.analyse.evidence import Evidence
from doctor.analyse.ops import RankOps
from doctor.analyse.precision import cpu_precision, gpu_precision
from doctor.analyse.roofline import BOUND_LAUNCH, BOUND_MEMORY
from doctor.rules.base import rule
from doctor.rules.sound import PLAIN_COMPILE
from doctor.trace.op_costs import CONV, CONV_BACKWARD, KIND_CONV
from doctor.verdict import Finding, Fix

MIN_SHARE = 0.15  # of the ops' time, for a class to be worth a finding
FUSED_SAVING = 0.5
LAUNCH_SAVING = 0.5
MIN_GEMM_FLOPS_SHARE = 0.5
MIN_LAYOUT_SHARE = 0.03  # of the ops' time in NCHW/NHWC transposes
WORTH_A_WARNING = 1.05  # a channels_last estimate below this is information


def _compute_share(ev: Evidence) -> float | None:
    ledger = ev.ledger
    if ledger is None or ledger.empty:
        return None
    wall = float(ledger["wall_s"].sum())
    return float(ledger["compute"].sum()) / wall if wall > 0 else None


def _gpu_busy_share(ev: Evidence) -> float | None:
    """The share of the window's GPU steps the GPU was busy (None: no GPU steps)."""
    frame = ev.window
    if frame is None or frame.empty or "gpu_busy_s" not in frame:
        return None
    if "device" in frame:
        frame = frame[frame["device"] == "cuda"]
    step = float(frame["dur_s"].sum()) if len(frame) else 0.0
    return min(1.0, float(frame["gpu_busy_s"].sum()) / step) if step > 0 else None


def ops_speedup(ev: Evidence, share_of_ops: float, r: RankOps) -> float | None:
    """The step's speedup with ``share_of_ops`` of the ops' time taken out.

    On a CPU the ops run on the training thread: the ledger's compute share of the step, times
    the share. On a GPU the ops' time is device time: it shortens the step as far as the GPU is
    what the step waits for, taken here as the share of the step it is busy (a GPU idle most of
    the step, waiting for the host, gains little from faster kernels)."""
    gpu = r.roofs.device == "cuda" if r.roofs is not None else float(r.table["device_s"].sum()) > 0
    if gpu:
        busy = _gpu_busy_share(ev)
        if busy is None or r.window_s <= 0:
            return None
        removed = share_of_ops * float(r.table["time_s"].sum()) / r.window_s * busy
    else:
        compute = _compute_share(ev)
        if compute is None:
            return None
        removed = compute * share_of_ops
    return 1.0 / (1.0 - removed) if 0 <= removed < 1 else None


def outside_optimizer(rows: pd.DataFrame) -> pd.Series:
    """Each op's share of the op time less the part spent in an optimizer's step."""
    opt = rows.get("opt_share", 0.0)
    return (rows["share"] - opt).clip(lower=0.0)


def _lowest(ev: Evidence) -> RankOps | None:
    ops = ev.ops
    return ops[min(ops)] if ops else None


@rule("ops.memory_bound", needs=("ops",))
def memory_bound(ev: Evidence) -> list[Finding]:
    r = _lowest(ev)
    if r is None or r.roofs is None:
        return []
    t = r.table
    chain = t[(t["bound"] == BOUND_MEMORY) & t["kind"].isin(("elementwise", "normalisation"))]
    outside = outside_optimizer(chain)
    share = float(outside.sum())
    if share < MIN_SHARE:
        return []
    left_out = float(chain["share"].sum()) - share  # in an optimizer's step
    chain = chain[outside > 0.5 * chain["share"]]  # named: the ops mostly outside it
    names = ", ".join(str(n).removeprefix("aten::") for n in chain["op"].head(4))
    return [Finding(
        id="ops.memory_bound", category="compute", severity="warning",
        title=(f"Memory-bound elementwise and normalisation ops take {share:.0%} of the ops' "
               f"time ({names})"),
        evidence={"rank": r.rank, "share_of_ops": share, "ops": list(chain["op"].head(8)),
                  "bytes": float(chain["bytes"].sum()),
                  "optimizer_share_left_out": left_out,
                  "of_roof_median": float(chain["of_roof"].median()),
                  "roofs": r.roofs.source},
        fixes=(Fix(title="Fuse them: torch.compile",
                   why="each of these reads and writes whole tensors to do a few operations "
                       "per element; compiled, a chain of them keeps its intermediates in "
                       f"registers. Fused in pairs, half of their {share:.0%} of the ops' time "
                       "goes away.",
                   code=PLAIN_COMPILE),),
        estimated_speedup=ops_speedup(ev, share * FUSED_SAVING, r),
    )]


@rule("ops.fp32_gemm", needs=("ops",))
def fp32_gemm(ev: Evidence) -> list[Finding]:
    r = _lowest(ev)
    if r is None or r.roofs is None:
        return []
    t = r.table
    flops = float(t["flops"].sum())
    gemm = t[t["kind"].isin(("matmul", "convolution")) & (t["roof_dtype"] == "fp32")]
    gpu = r.roofs.device == "cuda"
    if not gpu:  # the CPU's measured roofs say whether bf16 is faster here
        precision = cpu_precision(r.roofs)
    else:
        precision = ev.job.precision if ev.job.precision.device == "cuda" else gpu_precision(None)
    # the 16-bit type the device runs fast, and on a GPU TF32 (fp32 maths on Tensor Cores)
    fast = [d for d in ((precision.short, "tf32") if gpu else (precision.short,)) if d]
    fp32, half = r.roofs.flops.get("fp32"), max(
        (r.roofs.flops.get(d, 0.0) for d in fast), default=0.0)
    if gemm.empty or not fp32 or half <= 1.2 * fp32 or flops <= 0:
        return []
    flops_share, share = float(gemm["flops"].sum()) / flops, float(gemm["share"].sum())
    if flops_share < MIN_GEMM_FLOPS_SHARE or share < MIN_SHARE:
        return []
    saved = share * (1.0 - fp32 / half)
    fixes = []
    low = r.roofs.flops.get(precision.short, 0.0)
    if precision.dtype is not None and low > 1.2 * fp32 \
            and ev.job.autocasts_on("cuda" if gpu else "cpu") is None:
        fixes.append(Fix(title=f"Autocast to {precision.dtype}",
                         why=f"the GEMMs do {flops_share:.0%} of the operations, in fp32; this "
                             f"machine's {precision.short} roof is {low / fp32:.1f}x its fp32 "
                             f"one ({precision.why})",
                         code=precision.autocast_code()))
    if gpu and "tf32" in r.roofs.flops:
        fixes.insert(0, Fix(title="TF32 for fp32 matmuls",
                            why="Tensor Cores do fp32 matrix maths in TF32 with no code change "
                                "beyond this line (10 bits of mantissa in the products)",
                            code="torch.set_float32_matmul_precision(\"high\")",
                            apply={"torch": {"matmul_precision": "high"}}))
    return [Finding(
        id="ops.fp32_gemm", category="compute", severity="warning",
        title=(f"fp32 GEMMs do {flops_share:.0%} of the operations and take {share:.0%} of the "
               f"ops' time; the {'GPU' if gpu else 'CPU'} does {half / fp32:.1f}x that in 16 "
               "bits"),
        evidence={"rank": r.rank, "gemm_flops_share": flops_share, "share_of_ops": share,
                  "fp32_peak_flops": fp32, "half_peak_flops": half, "roofs": r.roofs.source},
        fixes=tuple(fixes), estimated_speedup=ops_speedup(ev, saved, r),
    )]


@rule("ops.launch_bound", needs=("ops",))
def launch_bound(ev: Evidence) -> list[Finding]:
    r = _lowest(ev)
    if r is None or r.roofs is None:
        return []
    t = r.table
    tiny = t[t["bound"] == BOUND_LAUNCH]
    outside = outside_optimizer(tiny)
    share = float(outside.sum())
    if share < MIN_SHARE:
        return []
    left_out = float(tiny["share"].sum()) - share  # in an optimizer's step
    tiny = tiny[outside > 0.5 * tiny["share"]]  # named and counted: the calls mostly outside it
    gpu = r.roofs.device == "cuda"
    fixes = [Fix(title="CUDA graphs: torch.compile(mode=\"reduce-overhead\")",
                 why="one launch replays the step's many small kernels",
                 code="model = torch.compile(model, mode=\"reduce-overhead\")")] if gpu else []
    fixes.append(Fix(title="Fewer, larger ops: a larger batch, or torch.compile",
                     why=f"{int(tiny['calls'].sum())} calls too short for their work to "
                         "matter: the cost of issuing each is the cost",
                     code=PLAIN_COMPILE))
    return [Finding(
        id="ops.launch_bound", category="compute", severity="warning",
        title=f"Ops too small to pay for their launch take {share:.0%} of the ops' time",
        evidence={"rank": r.rank, "share_of_ops": share, "calls": int(tiny["calls"].sum()),
                  "ops": list(tiny["op"].head(8)), "optimizer_share_left_out": left_out},
        fixes=tuple(fixes), estimated_speedup=ops_speedup(ev, share * LAUNCH_SAVING, r),
    )]


def _convolutions(t: pd.DataFrame) -> pd.DataFrame:
    named = t["op"].isin(CONV | CONV_BACKWARD)
    return t[named | (t["kind"] == KIND_CONV)] if "kind" in t else t[named]


def _tensor_cores_for(r: RankOps, conv: pd.DataFrame) -> bool:
    """Whether the GPU's Tensor Cores take these convolutions: 16-bit ones, or fp32 ones where
    it has TF32 (cuDNN's default for convolutions)."""
    dtypes = set(conv["dtype"]) if "dtype" in conv else set()
    if dtypes & {"fp16", "bf16"}:
        return True
    return "fp32" in dtypes and r.roofs is not None and "tf32" in r.roofs.flops


@rule("ops.channels_last", needs=("ops",))
def channels_last(ev: Evidence) -> list[Finding]:
    r = _lowest(ev)
    if r is None or "layout_s" not in r.table:
        return []
    t = r.table
    total = float(t["time_s"].sum())
    if float(t["device_s"].sum()) <= 0 or total <= 0:
        return []  # a GPU's layouts: on a CPU the transposes are not kernels to see
    conv = _convolutions(t)
    transposes = float(t["layout_s"].sum())
    share, conv_share = transposes / total, float(conv["time_s"].sum()) / total
    nchw, nhwc = int(conv["nchw_calls"].sum()), int(conv["nhwc_calls"].sum())
    measured = share >= MIN_LAYOUT_SHARE
    by_strides = nchw > nhwc and conv_share >= MIN_SHARE and _tensor_cores_for(r, conv)
    if not measured and not by_strides:
        return []
    if measured:
        title = (f"cuDNN transposes NCHW tensors to NHWC and back around the convolutions: "
                 f"{share:.0%} of the GPU's op time")
        why = ("the Tensor Cores run convolutions NHWC; on NCHW tensors each one is wrapped in "
               f"transposes ({transposes * 1e3:.1f} ms in the window). In channels_last "
               "they go")
    else:
        title = (f"Convolutions take {conv_share:.0%} of the GPU's op time on NCHW tensors "
                 f"({nchw} of {nchw + nhwc} calls), where the Tensor Cores work NHWC")
        why = ("no transposes show in the trace, so there is no measured gain: cuDNN picks "
               "other kernels for NHWC tensors, often faster ones; try it")
    speedup = ops_speedup(ev, share, r) if measured else None
    return [Finding(
        id="ops.channels_last", category="compute",
        severity="warning" if speedup and speedup >= WORTH_A_WARNING else "info", title=title,
        evidence={"rank": r.rank, "transposes_s": transposes, "share_of_ops": share,
                  "convolution_share": conv_share, "nchw_calls": nchw, "nhwc_calls": nhwc,
                  "ops": list(t.loc[t["layout_s"] > 0, "op"].head(8))},
        fixes=(Fix(title="channels_last for the model and its inputs", why=why,
                   code="model = model.to(memory_format=torch.channels_last)\n"
                        "x = x.to(memory_format=torch.channels_last)  # each batch"),),
        estimated_speedup=speedup,
    )]
