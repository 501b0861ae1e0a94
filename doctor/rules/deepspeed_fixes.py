"""DeepSpeed ZeRO's fixes for its exposed collectives: its own config keys (the code is the
ds_config fragment, the apply the keys by their path, set by ``doctor try`` in the config the job
gives deepspeed.initialize: doctor.record.deepspeed_override), fitted to the engine's settings
as the sharding probe read them (doctor.probes.deepspeed_config), and never offered where the
job has the setting already.
Never DDP's fixes (DeepSpeed's reductions are its own), FSDP's code nor a BatchNorm fix (ZeRO-3's
small parameter gathers are no batch statistics).

Estimates come from the alpha-beta model fitted to the job's own ZeRO collectives
(doctor.analyse.comm_model.fit_link: each call ``alpha + f(kind, n) * bytes / beta``; fitted to
every rank's calls that did not wait, since a call that waited on one rank ran at the link's pace
on the last rank to start it), anchored to what the critical rank's calls measured (the model's
time scaled to the measured time, the exposed part kept as measured): a fix's saving is what the
model says the collectives it removes or shrinks take, less what it adds, and at most their
exposed time.

- ZeRO stage down where memory allows: stage 3 -> 2 keeps every parameter whole on each rank
  (the parameter bytes (n-1)/n more a rank): the all-gathers before forward and backward are
  replaced by one all-gather a step of the updated parameters after the optimizer's step
  (``allgather_bucket_size`` a call); stage 1 or 2 -> 0 keeps the whole optimizer state on each
  rank, and the all-gather of the updated parameters is gone. A floor: stage 3's hooks (fetching,
  releasing, partitioning parameters) are host work the model does not count;
- parameters kept whole (``stage3_param_persistence_threshold``) are all-gathered one call each
  after every step: where those small calls are exposed, a threshold of 0 gathers them with the
  large ones, in the coalesced gathers before forward. No estimate: their calls do go (on
  sample_jobs/deepspeed_zero.py the 8 small gathers and 11 ms of the 40 ms of exposed
  collectives a step), but the step did not get faster (0.95-1.06x, three ablations): ZeRO-3's
  fetching and releasing of those parameters, host work the model does not count, takes it back
  (yet ``doctor try``, which sets it in the job's config, measured 1.19x: try it);
- stage 3's all-gathers before backward (parameters released after forward:
  ``stage3_max_live_parameters`` / ``stage3_max_reuse_distance`` below the model's): the
  parameters kept live from forward to backward, those gathers gone;
- reductions or gathers in more calls than their buckets need (``reduce_bucket_size``,
  ``allgather_bucket_size`` smaller than a step's bytes): one bucket a step, the calls' latency
  saved;
- fp32 gradient reductions (no fp16/bf16, no ``communication_data_type``): bf16 on the wire, the
  reductions' bandwidth term halved;
- on a GPU, ``overlap_comm`` (off) and stage 3's prefetch bucket (smaller than a step's
  gathers): no estimate (how much backward can hide is not measured); on the CPU, DeepSpeed's
  communication streams are the training thread's, so neither is offered;
- ``gradient_accumulation_steps`` 1 at stage 0 or 1: reduce once per several micro-batches (a
  larger global batch; no estimate: it changes what a step is).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from doctor.analyse.comm_model import LinkFit, fit_link
from doctor.analyse.parallelism import SHARDED, Parallelism
from doctor.rules.comm_kinds import Exposed, estimate_of
from doctor.trace.collectives import COLLECTIVES, bus_factor
from doctor.verdict import Fix

MIB = 2**20
#: A collective under this is a latency-bound one (a parameter kept whole, a small bucket).
SMALL_BYTES = 256 * 1024
REDUCTIONS = ("reducescatter", "allreduce")
HALF = ("float16", "bfloat16", "half", "bf16", "fp16")


def ds_config(fragment: Mapping[str, Any], zero: bool = True) -> str:
    """A ds_config fragment as the code of a fix: ``zero``: under ``zero_optimization``."""
    body = json.dumps({"zero_optimization": dict(fragment)} if zero else dict(fragment),
                      indent=4)
    return "ds_config = " + body.replace("{\n", "{\n    ...,\n", 1)


def ds_setting(fragment: Mapping[str, Any], zero: bool = True) -> dict[str, Any]:
    """A fix's code (the ds_config fragment) and its apply for ``doctor try``: each key by its
    path in the config (doctor.tuning's ``deepspeed`` section)."""
    prefix = "zero_optimization." if zero else ""
    return {"code": ds_config(fragment, zero),
            "apply": {"deepspeed": {prefix + k: v for k, v in fragment.items()}}}


class ZeroModel:
    """The alpha-beta model fitted to one rank's ZeRO collectives, anchored to what they took."""

    def __init__(self, ex: Exposed, link: LinkFit, calls: pd.DataFrame) -> None:
        self.ex, self.link = ex, link
        sized = calls[calls["bytes"].notna()]
        modelled = self.seconds(sized)
        measured = float(sized["seconds"].sum())
        self.scale = measured / modelled if modelled > 0 else 1.0
        total = float(calls["seconds"].sum())
        self.exposed = float(calls["exposed_s"].sum()) / total if total > 0 else 0.0

    def seconds(self, calls: pd.DataFrame) -> float:
        """The modelled time of ``calls`` (kind, bytes) in all."""
        if calls.empty:
            return 0.0
        share = np.asarray([bus_factor(COLLECTIVES.index(k), self.ex.world)
                            if k in COLLECTIVES else 1.0 for k in calls["kind"].astype(str)])
        nbytes = calls["bytes"].fillna(0.0).to_numpy(float)
        return float((self.link.alpha_s + share * nbytes / self.link.beta_bytes_s).sum())

    def call_s(self, kind: str, nbytes: float, calls: int = 1) -> float:
        """The modelled time of ``calls`` collectives of ``kind`` moving ``nbytes`` in all."""
        return calls * self.link.alpha_s + \
            bus_factor(COLLECTIVES.index(kind), self.ex.world) * nbytes / self.link.beta_bytes_s

    def saved(self, before_s: float, after_s: float = 0.0) -> float:
        """The exposed seconds a step saved where the window's collectives that the model puts
        at ``before_s`` (over the window) take ``after_s`` instead."""
        return max(before_s - after_s, 0.0) * self.scale * self.exposed / self.ex.steps


def _estimate(model: ZeroModel | None, share: float, changed: pd.DataFrame, before_s: float,
              after_s: float = 0.0) -> float | None:
    """The speedup of a fix that changes the collectives ``changed`` (at most their exposed
    time a step saved)."""
    if model is None:
        return None
    cap = float(changed["exposed_s"].sum()) / model.ex.steps
    return estimate_of(share, model.ex, min(model.saved(before_s, after_s), cap))


def deepspeed_fixes(ex: Exposed, par: Parallelism, share: float,
                    every: pd.DataFrame | None = None) -> list[Fix]:
    """DeepSpeed's fixes (the module docstring) for the critical rank's ZeRO collectives;
    ``every``: every rank's collectives, the model's link is fitted to (the critical rank's
    where not given)."""
    config = par.deepspeed_config or {}
    calls = ex.of(SHARDED)
    if calls.empty:
        return []
    fitted = every if every is not None and "role" in every and len(every) else ex.calls
    link = fit_link(fitted, ex.world, of=fitted["role"] == SHARDED)
    model = ZeroModel(ex, link, calls) if link is not None and link.beta_bytes_s > 0 else None
    stage = config.get("stage")
    on_gpu = bool(calls["on_gpu"].any()) if "on_gpu" in calls else False
    out: list[Fix] = []
    for make in (_stage_down, _persistence, _live_parameters, _buckets, _bf16):
        out += make(ex, calls, config, model, share)
    if on_gpu:
        out += _overlap(ex, calls, config, stage)
    if stage in (0, 1) and config.get("gradient_accumulation_steps") == 1:
        out.append(_accumulation(ex, calls))
    return out


def _elem(config: Mapping[str, Any]) -> int:
    """Bytes of an element DeepSpeed communicates in (its half precision where enabled)."""
    return 2 if config.get("fp16") or config.get("bf16") else 4


def _holding(nbytes: float, elem: int) -> int:
    """A bucket size (elements, a power of two) that holds ``nbytes``."""
    return int(2 ** math.ceil(math.log2(max(nbytes / elem, 1.0))))


def _stage_down(ex: Exposed, calls: pd.DataFrame, config: Mapping[str, Any],
                model: ZeroModel | None, share: float) -> list[Fix]:
    stage = config.get("stage")
    gathers = calls[calls["kind"] == "allgather"]
    if stage not in (1, 2, 3) or gathers.empty:
        return []
    params = config.get("parameter_bytes")
    params = float(params) if isinstance(params, int | float) and params > 0 else \
        float(gathers["bytes"].sum()) / ex.steps
    more = params * (ex.world - 1) / ex.world
    gathered = float(gathers["exposed_s"].sum()) / ex.steps
    if stage == 3:
        bucket = config.get("allgather_bucket_size")
        per_call = float(bucket) * _elem(config) if isinstance(bucket, int) and bucket > 0 \
            else params
        n = max(math.ceil(params / per_call), 1)
        after = model.call_s("allgather", params, n) * ex.steps if model is not None else 0.0
        before = model.seconds(gathers) if model is not None else 0.0
        why = (f"{len(gathers) / ex.steps:g} parameter all-gathers a step, "
               f"{gathered * 1e3:.1f} ms exposed: at stage 3 each rank holds 1/{ex.world} of "
               f"the parameters and gathers them before use; at stage 2 each holds them whole "
               f"({more / MIB:.1f} MiB more a rank) and gathers only its updated shard after "
               f"the optimizer's step ({n} all-gather{'s' if n != 1 else ''} a step); the "
               "estimate is a floor: stage 3's hooks (fetching, releasing, partitioning the "
               "parameters) go too")
        return [Fix(title="ZeRO stage 3 -> 2 where the parameters fit whole on each rank",
                    why=why, **ds_setting({"stage": 2}),
                    estimated_speedup=_estimate(model, share, gathers, before, after))]
    before = model.seconds(gathers) if model is not None else 0.0
    why = (f"{len(gathers) / ex.steps:g} all-gathers a step of the updated parameters after "
           f"the optimizer's step, {gathered * 1e3:.1f} ms exposed: at stage {stage} each rank "
           f"steps 1/{ex.world} of the optimizer state; at stage 0 each steps all of it "
           f"({ex.world - 1}/{ex.world} more optimizer state a rank, about "
           f"{2 * more / MIB:.1f} MiB for Adam's two moments here) and gathers nothing")
    return [Fix(title=f"ZeRO stage {stage} -> 0 where the optimizer state fits whole on each "
                      "rank", why=why, **ds_setting({"stage": 0}),
                estimated_speedup=_estimate(model, share, gathers, before))]


def _persistence(ex: Exposed, calls: pd.DataFrame, config: Mapping[str, Any],
                 model: ZeroModel | None, share: float) -> list[Fix]:
    """Stage 3's parameters kept whole, gathered one call each after every step."""
    kept = config.get("persistent_params")
    if config.get("stage") != 3 or not isinstance(kept, int) or kept < 2 or \
            config.get("stage3_param_persistence_threshold") == 0:
        return []
    small = calls[(calls["kind"] == "allgather") & (calls["bytes"] < SMALL_BYTES)]
    per_step = len(small) / ex.steps
    if per_step < 2:
        return []
    exposed = float(small["exposed_s"].sum()) / ex.steps
    threshold = config.get("stage3_param_persistence_threshold")
    why = (f"{kept} parameters under stage3_param_persistence_threshold ({threshold}) are kept "
           f"whole on every rank and all-gathered one call each after every step: "
           f"{per_step:g} small all-gathers a step "
           f"({float(small['bytes'].median()) / 1024:.1f} KiB median), {exposed * 1e3:.1f} ms "
           "exposed, each a round trip; with 0 they are gathered with the large parameters, in "
           "the same coalesced all-gathers before forward, and fetched and released with them "
           "(host work that can take back what the calls save: no estimate, try it)")
    return [Fix(title="Gather the small parameters with the large ones "
                      "(stage3_param_persistence_threshold: 0)",
                why=why, **ds_setting({"stage3_param_persistence_threshold": 0}))]


def _live_parameters(ex: Exposed, calls: pd.DataFrame, config: Mapping[str, Any],
                     model: ZeroModel | None, share: float) -> list[Fix]:
    """Stage 3's parameters gathered again before backward: kept live from forward."""
    back = calls[(calls["kind"] == "allgather") & (calls["phase"] == "backward")] \
        if "phase" in calls else calls.iloc[:0]
    if config.get("stage") != 3 or back.empty:
        return []
    params = config.get("parameter_bytes")
    elements = int(params) // _elem(config) if isinstance(params, int) else None
    live = config.get("stage3_max_live_parameters")
    if isinstance(live, int) and elements is not None and live >= elements:
        return []  # the setting holds the whole model already
    value = elements if elements is not None else 1_000_000_000
    exposed = float(back["exposed_s"].sum()) / ex.steps
    before = model.seconds(back) if model is not None else 0.0
    why = (f"{len(back) / ex.steps:g} all-gathers a step before backward, {exposed * 1e3:.1f} "
           f"ms exposed: the parameters were released after forward "
           f"(stage3_max_live_parameters={live}); kept live to backward, for the gathered "
           "parameters' memory held in between, those gathers are gone")
    return [Fix(title="Keep the gathered parameters live from forward to backward "
                      "(stage3_max_live_parameters, stage3_max_reuse_distance)",
                why=why, **ds_setting({"stage3_max_live_parameters": value,
                                         "stage3_max_reuse_distance": value}),
                estimated_speedup=_estimate(model, share, back, before))]


def _buckets(ex: Exposed, calls: pd.DataFrame, config: Mapping[str, Any],
             model: ZeroModel | None, share: float) -> list[Fix]:
    """Reductions (or, below stage 3, gathers) in more calls a step than one bucket needs."""
    out: list[Fix] = []
    elem = _elem(config)
    for key, kinds, what in (("reduce_bucket_size", REDUCTIONS, "gradient reductions"),
                             ("allgather_bucket_size", ("allgather",),
                              "all-gathers of the updated parameters")):
        if key == "allgather_bucket_size" and config.get("stage") == 3:
            continue  # stage 3 gathers by its prefetch bucket, not this one
        mine = calls[calls["kind"].isin(kinds) & calls["bytes"].notna()]
        per_step = len(mine) / ex.steps
        if per_step < 3 or float(mine["bytes"].median()) >= SMALL_BYTES:
            continue
        nbytes = float(mine["bytes"].sum()) / ex.steps
        bucket = config.get(key)
        if not isinstance(bucket, int) or bucket * elem >= nbytes:
            continue  # its bucket holds a step's bytes already: the calls are not its
        value = _holding(nbytes, elem)
        before = model.seconds(mine) if model is not None else 0.0
        after = model.call_s(str(mine["kind"].mode().iloc[0]), nbytes) * ex.steps \
            if model is not None else 0.0
        exposed = float(mine["exposed_s"].sum()) / ex.steps
        out.append(Fix(
            title=f"One bucket a step for the {what} ({key}: {value:.3g})",
            why=(f"{per_step:g} {what} a step of {float(mine['bytes'].median()) / 1024:.1f} KiB "
                 f"(median), {exposed * 1e3:.1f} ms exposed, each a round trip: {key}={bucket} "
                 f"elements holds less than a step's {nbytes / MIB:.2f} MiB"),
            **ds_setting({key: value}),
            estimated_speedup=_estimate(model, share, mine, before, after)))
    return out


def _bf16(ex: Exposed, calls: pd.DataFrame, config: Mapping[str, Any],
          model: ZeroModel | None, share: float) -> list[Fix]:
    """fp32 gradient reductions: bf16 on the wire."""
    if config.get("fp16") or config.get("bf16") or \
            str(config.get("communication_data_type", "float32")) in HALF:
        return []
    mine = calls[calls["kind"].isin(REDUCTIONS) & calls["bytes"].notna()]
    if mine.empty or float(mine["bytes"].median()) < SMALL_BYTES:
        return []  # latency-bound reductions: fewer bytes save nothing
    before = model.seconds(mine) if model is not None else 0.0
    after = model.seconds(mine.assign(bytes=mine["bytes"] / 2)) if model is not None else 0.0
    exposed = float(mine["exposed_s"].sum()) / ex.steps
    return [Fix(
        title="Reduce the gradients in bf16 (communication_data_type: bf16)",
        why=(f"{len(mine) / ex.steps:g} gradient reductions a step of "
             f"{float(mine['bytes'].sum()) / ex.steps / MIB:.2f} MiB in fp32, "
             f"{exposed * 1e3:.1f} ms exposed: bf16 halves the bytes on the wire (the sum "
             "loses precision beyond bf16's 8 bits of mantissa; check the loss curve)"),
        **ds_setting({"communication_data_type": "bf16"}, zero=False),
        estimated_speedup=_estimate(model, share, mine, before, after))]


def _overlap(ex: Exposed, calls: pd.DataFrame, config: Mapping[str, Any],
             stage: Any) -> list[Fix]:
    """On a GPU: overlap_comm off, stage 3's prefetch bucket under a step's gathers."""
    out: list[Fix] = []
    reductions = calls[calls["kind"].isin(REDUCTIONS)]
    if config.get("overlap_comm") is False and len(reductions) and stage in (1, 2, 3):
        exposed = float(reductions["exposed_s"].sum()) / ex.steps
        out.append(Fix(
            title="Overlap the gradient reductions with backward (overlap_comm: true)",
            why=(f"gradient reductions {exposed * 1e3:.1f} ms exposed a step, overlap_comm "
                 "off: DeepSpeed reduces each bucket on a stream of its own while backward "
                 "goes on, for a second bucket's memory"),
            **ds_setting({"overlap_comm": True})))
    gathers = calls[(calls["kind"] == "allgather") & calls["bytes"].notna()]
    bucket = config.get("stage3_prefetch_bucket_size")
    gathered = float(gathers["bytes"].sum()) / ex.steps if len(gathers) else 0.0
    if stage == 3 and isinstance(bucket, int) and bucket * _elem(config) < gathered:
        value = _holding(gathered, _elem(config))
        exposed = float(gathers["exposed_s"].sum()) / ex.steps
        out.append(Fix(
            title=f"Prefetch more parameters ahead (stage3_prefetch_bucket_size: {value:.3g})",
            why=(f"parameter all-gathers {exposed * 1e3:.1f} ms exposed a step; the prefetch "
                 f"bucket ({bucket} elements) holds less than a step's "
                 f"{gathered / MIB:.1f} MiB gathered, so the next layers' gathers start late"),
            **ds_setting({"stage3_prefetch_bucket_size": value})))
    return out


def _accumulation(ex: Exposed, calls: pd.DataFrame) -> Fix:
    exposed = float(calls["exposed_s"].sum()) / ex.steps
    return Fix(
        title="Reduce once per several micro-batches (gradient_accumulation_steps)",
        why=(f"ZeRO's collectives take {exposed * 1e3:.1f} ms exposed every step; with "
             "gradient_accumulation_steps k, stages 0 and 1 reduce and gather once per k "
             "micro-batches (a k times larger global batch: the learning rate may need "
             "retuning)"),
        code=ds_config({"gradient_accumulation_steps": 4}, zero=False))
