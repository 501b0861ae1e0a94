"""FSDP's fixes for its exposed collectives, each named by the phase it acts on
(doctor.analyse.shard_phases) and estimated from that phase's measured exposed time:

- prefetch a phase's all-gathers (FSDP2's ``set_modules_to_forward_prefetch`` /
  ``set_modules_to_backward_prefetch``, FSDP1's ``forward_prefetch`` / ``backward_prefetch``):
  at most what one unit ahead can hide (the phase's ``hideable_s``: each exposed all-gather up to
  the compute before it), as far as a core is free for the communication threads; none where
  the phase's prefetch already worked, or where FSDP1's own setting for it is already on;
  FSDP1's on a CPU without an estimate or an apply (its gathers are synchronous there: a
  prefetched one still holds the thread; a try of the sample measured 0.79x);
- keep the last units gathered after forward (``reshard_after_forward=False``): the backward
  all-gathers' exposed time, for the memory of the gathered units held to backward;
- wrap fewer, larger units (no estimate: one unit size measured says nothing of the latency a
  call saves).

Only for FSDP's shape: parameters all-gathered before forward (a job that gathers in backward
alone, sequence or tensor parallel, gets none of them).

Never DDP's fixes: the all-gathers and reduce-scatters are FSDP's."""

from __future__ import annotations

from doctor.analyse.parallelism import SHARDED, Parallelism
from doctor.analyse.shard_phases import (
    AHEAD,
    BACKWARD_GATHERS,
    FORWARD_GATHERS,
    WORKED,
    PhaseCost,
    rank_phases,
)
from doctor.rules.comm_kinds import Exposed, estimate_of
from doctor.verdict import Fix

MIB = 2**20
#: A gather phase exposed under this share of the sharded collectives' exposed time gets no
#: prefetch fix of its own.
PHASE_SHARE = 0.1


def sharded_fixes(ex: Exposed, par: Parallelism | None, share: float, overlap_cores: float,
                  compute_s: float) -> list[Fix]:
    """FSDP's fixes (the module docstring) for the critical rank's collectives ``ex``;
    ``share``: communication's share of the step; ``overlap_cores``: the cores free for the
    communication threads (0-1); ``compute_s``: the step's compute, a bound on what can hide
    where the trace gives no compute before each all-gather."""
    fsdp1 = par is not None and par.sharded == "FSDP"
    phases = rank_phases(ex.calls, ex.steps)
    on_gpu = bool(ex.calls["on_gpu"].any()) if "on_gpu" in ex.calls else False
    out: list[Fix] = []
    if phases is None or phases.of(FORWARD_GATHERS) is None:
        # no parameters gathered before forward: not FSDP's (or ZeRO-3's) shape (sequence or
        # tensor parallel gathers activations in backward): none of its fixes fit
        return out
    sharded = phases.exposed_s
    for phase in (phases.of(FORWARD_GATHERS), phases.of(BACKWARD_GATHERS)):
        if phase is None or phase.prefetch == WORKED or sharded <= 0 or \
                phase.exposed_s < PHASE_SHARE * sharded or prefetch_set(par, phase.phase):
            continue
        has_before = "compute_before_s" in ex.calls
        hidden = (phase.hideable_s if has_before else min(phase.exposed_s, compute_s)) * \
            overlap_cores
        out.append(prefetch_fix(phase, fsdp1, on_gpu, overlap_cores,
                                estimate_of(share, ex, hidden)))
    back = phases.of(BACKWARD_GATHERS)
    if back is not None:
        hybrid = fsdp1 and par is not None and "HYBRID_SHARD" in par.settings
        out.append(reshard_fix(ex, back, fsdp1, share, hybrid))
    gathers = ex.of(SHARDED, "allgather")
    if len(gathers):
        calls = len(gathers) / ex.steps
        size = float(gathers["bytes"].median())
        trip = float(gathers["seconds"].median())
        units = par.units if par is not None and par.units else 0
        out.append(Fix(
            title="Wrap fewer, larger units",
            why=(f"{calls:g} all-gathers a step of {size / MIB:.2f} MiB each (median, "
                 f"{trip * 1e3:.2f} ms a call)" + (f" over {units} units" if units else "")
                 + ": each collective pays its latency; a unit of several layers gathers "
                   "them in one call, for its larger unsharded size held at once"),
            code=("FullyShardedDataParallel(model, ...,  # a transformer block, not each "
                  "layer\n    auto_wrap_policy=ModuleWrapPolicy({Block}))" if fsdp1 else
                  "for block in model.blocks:  # a transformer block, not each of its layers\n"
                  "    fully_shard(block)\nfully_shard(model)")))
    return out


#: FSDP1's settings (as the sharding probe records them) that already prefetch each phase.
FSDP1_PREFETCH = {FORWARD_GATHERS: "forward_prefetch=True", BACKWARD_GATHERS: "BACKWARD_PRE"}


def prefetch_set(par: Parallelism | None, phase: str) -> bool:
    """Whether the job's FSDP1 modules already prefetch ``phase`` (the fix would be its own
    setting: none is given)."""
    return par is not None and par.sharded == "FSDP" and \
        FSDP1_PREFETCH.get(phase, "\0") in par.settings


def prefetch_fix(phase: PhaseCost, fsdp1: bool, on_gpu: bool, overlap_cores: float,
                 estimate: float | None) -> Fix:
    """Prefetch one phase's all-gathers: its exposed time, how far prefetching got, and what
    one unit ahead can hide."""
    forward = phase.phase == FORWARD_GATHERS
    why = (f"{phase.calls:g} all-gathers a step, {phase.exposed_s * 1e3:.1f} ms of their "
           f"{phase.seconds * 1e3:.1f} ms exposed; prefetch: {phase.prefetch}")
    if phase.prefetch == AHEAD:
        why += (" (FSDP's hooks issued them ahead, but nothing ran beside them"
                + ("" if on_gpu else ": on the CPU a synchronous all-gather blocks the thread "
                   "that issued it, so prefetch needs an asynchronous unshard") + ")")
    why += (f"; the compute before each, which gathering one unit ahead runs beside, could "
            f"hide {phase.hideable_s * 1e3:.1f} ms a step")
    if overlap_cores <= 0:
        why += " (on this machine no core is free for the communication threads: none now)"
    blocking = fsdp1 and not on_gpu  # FSDP1 has no asynchronous unshard
    if blocking:
        why += ("; but on the CPU FSDP1's all-gathers are synchronous (it has no asynchronous "
                "unshard): a prefetched gather still holds the thread that issued it, so "
                "prefetch pays on a GPU only (no estimate, and nothing for doctor try here)")
        estimate = None
    if fsdp1:
        code = ("FullyShardedDataParallel(model, ..., forward_prefetch=True)" if forward else
                "FullyShardedDataParallel(model, ...,\n"
                "    backward_prefetch=BackwardPrefetch.BACKWARD_PRE)")
    elif forward:
        code = ("# FSDP2: gather the next unit while this one computes\n"
                "for i, layer in enumerate(layers[:-1]):\n"
                "    layer.set_modules_to_forward_prefetch([layers[i + 1]])")
    else:
        code = ("# FSDP2: gather the previous unit while this one's backward runs\n"
                "for i, layer in enumerate(layers[1:], start=1):\n"
                "    layer.set_modules_to_backward_prefetch([layers[i - 1]])")
    if not on_gpu and not fsdp1:
        code += ("\n# on the CPU (gloo) the gathers must not block the thread:\n"
                 "model._set_unshard_async_op(True)  # FSDP2's asynchronous unshard")
    words = "forward" if forward else "backward"
    api = (("forward_prefetch=True" if forward else "backward_prefetch=BACKWARD_PRE")
           if fsdp1 else f"set_modules_to_{words}_prefetch")
    # FSDP1's are settings doctor try applies (on a GPU); FSDP2's name the modules: code
    apply = ({"fsdp1": {"forward_prefetch": True} if forward
              else {"backward_prefetch": "BACKWARD_PRE"}} if fsdp1 and not blocking else None)
    return Fix(title=(f"{phase.phase.capitalize()} exposed {phase.exposed_s * 1e3:.1f} ms a "
                      f"step: prefetch them ({api})"),
               why=why, code=code, estimated_speedup=estimate, apply=apply)


def reshard_fix(ex: Exposed, back: PhaseCost, fsdp1: bool, share: float,
                hybrid: bool = False) -> Fix:
    """reshard_after_forward=False: the backward all-gathers gone, for the memory of the
    gathered units held from forward to backward; the last unit's figures apart (its backward
    follows its forward at once). FSDP1's is a strategy of every unit: SHARD_GRAD_OP (ZeRO-2),
    or its hybrid one where the job shards within a node."""
    calls = ex.of(SHARDED, "allgather", "backward")
    gathered = back.bytes * (ex.world - 1) / ex.world if back.bytes == back.bytes else 0.0
    first = calls.sort_values("start_us").groupby("unit", sort=False).head(1) \
        if "unit" in calls else calls.iloc[:0]
    last_unit = str(first["unit"].iloc[0]) if len(first) else ""
    last = calls[calls["unit"] == last_unit] if last_unit else calls.iloc[:0]
    last_saved = float(last["exposed_s"].sum()) / ex.steps
    last_bytes = float(last["bytes"].sum()) / ex.steps * (ex.world - 1) / ex.world
    why = (f"each unit is gathered again before its backward: {back.exposed_s * 1e3:.1f} ms of "
           f"exposed all-gathers a step, for {gathered / MIB:.1f} MiB more a rank held from "
           "forward to backward (all units)")
    if last_unit and last_bytes < gathered:
        why += (f"; the last unit ({last_unit}) alone, whose backward follows its forward at "
                f"once: {last_saved * 1e3:.1f} ms for {last_bytes / MIB:.1f} MiB")
    code = ("fully_shard(model.layers[-1], reshard_after_forward=False)  # the last units\n"
            "fully_shard(model)  # the root: FSDP2 keeps it gathered after forward already")
    strategy = "_HYBRID_SHARD_ZERO2" if hybrid else "SHARD_GRAD_OP"
    if fsdp1:
        code = ("FullyShardedDataParallel(model, ...,\n"
                f"    sharding_strategy=ShardingStrategy.{strategy})  # ZeRO-2: no regather")
    title = (f"shard only gradients and optimizer state ({strategy})" if fsdp1 else
             "keep the last units gathered after forward (reshard_after_forward=False)")
    return Fix(title=f"Backward all-gathers exposed {back.exposed_s * 1e3:.1f} ms a step: {title}",
               why=why, code=code, estimated_speedup=estimate_of(share, ex, back.exposed_s),
               frees_bytes=None,
               # every unit, as the estimate assumes
               apply=({"fsdp1": {"sharding_strategy": strategy}} if fsdp1
                      else {"fsdp": {"reshard_after_forward": False}}))
