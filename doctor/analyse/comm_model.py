"""A model of one rank's gradient communication, fitted to its own profiler window, and what it
predicts for the fixes: other bucket sizes, ``no_sync()`` every k steps, bf16 compression, and
the step at N ranks.

The model (the textbook alpha-beta model of a ring all-reduce, as DDP runs it):

- a collective of ``b`` bytes takes ``alpha + f(n) * b / beta``: ``alpha`` a call's latency,
  ``beta`` the bus bandwidth, ``f(n) = 2(n-1)/n`` the share of the message each rank's link
  carries in an all-reduce over ``n`` ranks (doctor.trace.collectives). ``alpha`` and ``beta``
  are fitted to the rank's own collectives that did not wait for another rank (least squares
  where their sizes differ, the best bandwidth seen otherwise);
- DDP all-reduces a step's ``B`` gradient bytes in ``k`` buckets (its ``bucket_cap_mb``); each
  bucket's all-reduce starts when backward has filled it, so all but the last bucket can hide
  behind the rest of backward. The **overlap capacity** ``C`` is the backward time that
  communication can run beside: measured as the overlapped part of the communication when the
  exposed part is more than the last bucket (comm outlasted what could hide it), otherwise DDP's
  own backward compute time. One bucket (``k = 1``) starts only when backward ends: nothing
  overlaps. With ``k`` buckets, ``C = W (1 - 1/k)`` for a backward of ``W``;
- exposed communication: ``max(T - C, t_last)``, ``T`` the step's collective time and
  ``t_last`` the last bucket's;
- every prediction is anchored to the measurement: modelled times are scaled by the ratio of
  the measured collective time to the modelled one (what the model leaves out, such as cores
  shared with communication threads, stays in proportion), and a fix changes only the exposed
  communication of the measured step.

Pure functions over one rank's figures; the rules (doctor.rules.communication) word them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from doctor.trace.collectives import COLLECTIVES, bus_factor

#: DDP's default bucket cap and first bucket (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES).
DEFAULT_CAP_BYTES = 25 * 2**20
MIN_CAP_BYTES = 2**20
#: Bucket caps tried: these multiples of the job's own.
CAP_FACTORS = (0.25, 0.5, 2.0, 4.0)
MIN_R2 = 0.9  # a latency-bandwidth line is kept only where it explains this much
ACCUMULATION = 4  # no_sync() on all but every 4th step
SCALES = (2, 4, 8, 16, 32, 64)  # rank counts of the scaling table
HALF_DTYPES = ("half", "bfloat16", "float16", "c10::half", "c10::bfloat16")
ALLREDUCE = COLLECTIVES.index("allreduce")


def allreduce_factor(world: int) -> float:
    return bus_factor(ALLREDUCE, world)


def gradient_reduces(calls: pd.DataFrame) -> pd.Series:
    """Which collectives are the gradient all-reduces the model is of: all-reduces whose role
    (doctor.analyse.parallelism, where the frame has one) is ``gradients``, not a batch
    statistic's nor a sharded job's."""
    mask = calls["kind"] == "allreduce"
    return mask & (calls["role"] == "gradients") if "role" in calls else mask


@dataclass(frozen=True)
class LinkFit:
    alpha_s: float  # latency per collective
    beta_bytes_s: float  # bus bandwidth
    calls: int  # collectives it was fitted to
    how: str  # "fit" (a line through sizes that differ), "bandwidth" (alpha from the smaller
    # calls; "latency unknown": one size, alpha 0), "latency" (small calls only)

    def seconds(self, nbytes: float, world: int, calls: float = 1.0) -> float:
        """Modelled time of ``calls`` all-reduces moving ``nbytes`` in all, over ``world``."""
        return calls * self.alpha_s + allreduce_factor(world) * nbytes / self.beta_bytes_s


def fit_link(calls: pd.DataFrame, world: int, of: pd.Series | None = None) -> LinkFit | None:
    """``alpha`` and ``beta`` from a rank's all-reduces of known size that did not wait (or
    the collectives ``of`` marks, each by its own kind's bus share): a least-squares line
    where their sizes differ and it explains their times (``MIN_R2``; a collective that shared
    the link with others, or waited in a way the trace does not show, breaks it); otherwise
    the best bandwidth seen, with no latency (or, when every call is small, the latency
    only)."""
    if calls.empty or world < 2:
        return None
    mask = gradient_reduces(calls) if of is None else of
    use = calls[mask & calls["bytes"].notna() &
                (calls["seconds"] > 0) & (calls.get("bound", "") != "waiting")]
    if use.empty:
        return None
    factors = [bus_factor(COLLECTIVES.index(k), world) if k in COLLECTIVES else 1.0
               for k in use["kind"].astype(str)]
    x = use["bytes"].to_numpy(float) * np.asarray(factors, float)
    y = use["seconds"].to_numpy(float)
    if len(x) >= 3 and x.max() >= 4 * x.min():
        slope, intercept = np.polyfit(x, y, 1)
        residual = y - (slope * x + intercept)
        r2 = 1.0 - float(residual @ residual) / max(float(((y - y.mean()) ** 2).sum()), 1e-30)
        if slope > 0 and intercept >= 0 and r2 >= MIN_R2:
            return LinkFit(float(intercept), float(1 / slope), len(x), "fit")
    beta = float((x / y).max())  # the best the link was seen to do
    if bool((use["bytes"] < 256 * 1024).all()):
        return LinkFit(float(np.median(np.maximum(y - x / beta, 0.0))), beta, len(x), "latency")
    if x.min() > x.max() / 4:
        return LinkFit(0.0, beta, len(x), "bandwidth, latency unknown")
    smallest = x <= 2 * x.min()  # the latency, as far as the smallest calls show it
    alpha = float(np.median(np.maximum(y[smallest] - x[smallest] / beta, 0.0)))
    return LinkFit(alpha, beta, len(x), "bandwidth")


@dataclass(frozen=True)
class RankComm:
    """One rank's communication per step, measured, and the model fitted to it."""

    rank: int
    world: int
    step_s: float  # mean analysed window step
    comm_s: float  # all-reduces per step (their share of the step's collectives)
    exposed_s: float  # of which no compute overlapped (less any wait for a straggler)
    bytes_per_step: float  # all-reduced per step
    calls_per_step: float  # all-reduces per step
    cap_bytes: float  # DDP's bucket cap (the default when DDP was not seen)
    last_bucket_bytes: float
    capacity_s: float  # overlap capacity C (see the module docstring)
    backward_s: float  # W: backward that communication can overlap
    fp32_grads: bool | None  # None: the gradients' dtype is unknown
    link: LinkFit
    scale: float  # measured / modelled collective time
    overlap_cores: float = 1.0  # a core for communication beside each rank's training thread

    @property
    def buckets(self) -> float:
        return max(1.0, self.calls_per_step)

    def collective_s(self, nbytes: float, calls: float, world: int | None = None,
                     alpha_factor: float = 1.0) -> float:
        link = replace(self.link, alpha_s=self.link.alpha_s * alpha_factor)
        return self.scale * link.seconds(nbytes, world or self.world, calls)

    def exposed(self, comm_s: float, last_s: float, capacity_s: float) -> float:
        return max(comm_s - capacity_s, last_s, 0.0)


def rank_comm(rank: int, world: int, steps: pd.DataFrame, calls: pd.DataFrame,
              ddp: pd.DataFrame, waited_s: float = 0.0, overlap_cores: float = 1.0,
              link_bytes_s: float | None = None) -> RankComm | None:
    """The model of one rank (None where it cannot be fitted: one rank, no sized
    all-reduces, or no steps). ``waited_s``: per step, the straggler's share of the exposed
    time, taken out. ``overlap_cores``: the share of a core each rank's communication threads
    find beside its training thread (1 where the collectives run on a GPU; on a CPU job, the
    cores left over by the ranks' training threads): more overlap needs them.
    ``link_bytes_s``: the link's own bandwidth, where known: the bandwidth of a job whose
    collectives are all small (their time is latency; queued behind each other, as gloo's
    asynchronous work is, each one's span says little), whose latency is then the step's
    collective time per call, less that bandwidth's part."""
    link = fit_link(calls, world)
    if link is None or steps.empty:
        return None
    n_steps = len(steps)
    step_s = float(steps["dur_s"].mean())
    reduce = calls[gradient_reduces(calls)]
    # the all-reduces' part of the step's collectives (other kinds, an embedding's all-to-all,
    # stay as they are in every prediction)
    time_part = _part(reduce["seconds"], calls["seconds"])
    exposed_part = _part(reduce["exposed_s"], calls["exposed_s"]) if "exposed_s" in calls \
        else time_part
    comm_s = float(steps["comm_s"].mean()) * time_part
    exposed_s = max(float(steps["comm_exposed_s"].mean()) - waited_s, 0.0) * exposed_part
    nbytes = float(reduce["bytes"].sum()) / n_steps
    per_step = len(reduce) / n_steps
    d = ddp.iloc[0] if not ddp.empty else None
    cap = _num(d, "bucket_cap_bytes") or DEFAULT_CAP_BYTES
    last = _num(d, "last_bucket_bytes") or min(cap, nbytes)
    if nbytes <= 0 or comm_s <= 0 or step_s <= 0:
        return None
    if link.how == "latency":
        beta = link_bytes_s or link.beta_bytes_s
        alpha = comm_s / per_step - allreduce_factor(world) * (nbytes / per_step) / beta
        link = replace(link, alpha_s=max(alpha, 0.0), beta_bytes_s=beta)
    modelled = link.seconds(nbytes, world, per_step)
    scale = comm_s / modelled if modelled > 0 else 1.0
    last_s = scale * link.seconds(min(last, nbytes), world)
    overlapped = max(comm_s - exposed_s, 0.0)
    ddp_backward = _num(d, "backward_compute_s") or 0.0
    k = max(1.0, per_step)
    if exposed_s > last_s * 1.1 or k <= 1:
        capacity = overlapped  # communication outlasted what could hide it
    else:
        capacity = max(overlapped, ddp_backward * (1 - 1 / k))
    backward = capacity / (1 - 1 / k) if k > 1 else max(ddp_backward, overlapped)
    return RankComm(rank=rank, world=world, step_s=step_s, comm_s=comm_s, exposed_s=exposed_s,
                    bytes_per_step=nbytes, calls_per_step=per_step, cap_bytes=cap,
                    last_bucket_bytes=min(last, nbytes), capacity_s=capacity,
                    backward_s=backward, fp32_grads=_fp32(d), link=link, scale=scale,
                    overlap_cores=min(max(overlap_cores, 0.0), 1.0))


@dataclass(frozen=True)
class WhatIf:
    """One change and what the model predicts for a rank's step."""

    fix: str  # "bucket_cap", "no_sync", "compress"
    setting: str  # what it sets, in the job's own terms
    exposed_s: float
    step_s: float
    speedup: float
    note: str = ""
    value: float | None = None  # the number the setting sets (a bucket cap, in MB)



def _step(m: RankComm, exposed: float) -> float:
    return max(m.step_s - m.exposed_s + exposed, 1e-9)


def _what_if(m: RankComm, fix: str, setting: str, exposed: float, note: str = "",
             value: float | None = None) -> WhatIf:
    step = _step(m, exposed)
    return WhatIf(fix, setting, exposed, step, m.step_s / step, note, value)


def overlap_capacity(m: RankComm, k: float) -> float:
    """The overlap capacity with ``k`` buckets: what was measured, scaled by ``1 - 1/k`` for
    fewer buckets; for more, up to ``W (1 - 1/k)``, as far as a free core lets the
    communication threads run beside backward."""
    if k < m.buckets:
        return m.capacity_s * (1 - 1 / k) / (1 - 1 / m.buckets)
    more = max(m.backward_s * (1 - 1 / k) - m.capacity_s, 0.0)
    return m.capacity_s + more * m.overlap_cores


def bucket_what_ifs(m: RankComm) -> list[WhatIf]:
    """Other bucket caps: more buckets overlap more of backward and pay more latency, fewer pay
    less and overlap less (one bucket: none)."""
    out = []
    caps = {m.cap_bytes * f for f in CAP_FACTORS} | {DEFAULT_CAP_BYTES}
    for cap in sorted(caps):
        smaller = cap < m.cap_bytes
        if cap == m.cap_bytes or (smaller and cap < MIN_CAP_BYTES) or \
                (not smaller and m.buckets <= 1):
            continue  # below DDP's first bucket, or already one bucket
        k = max(1.0, math.ceil(m.bytes_per_step / cap))
        last = m.bytes_per_step - (k - 1) * cap if k > 1 else m.bytes_per_step
        comm = m.collective_s(m.bytes_per_step, k)
        last_s = m.collective_s(last, 1)
        capacity = overlap_capacity(m, k)
        note = f"{k:g} buckets"
        if smaller and m.link.how.endswith("latency unknown"):
            note += " (each call's latency unknown: counted as none)"
        cap_mb = float(f"{cap / 2**20:g}")  # as the setting says it
        out.append(_what_if(m, "bucket_cap", f"bucket_cap_mb={cap_mb:g}",
                            m.exposed(comm, last_s, capacity), note, cap_mb))
    return out


def no_sync_what_if(m: RankComm, every: int = ACCUMULATION, micro_batches: int = 1) -> WhatIf:
    """Gradient accumulation: one all-reduce every ``every`` steps (the others skip it); where
    the job already accumulates ``micro_batches`` M > 1 a step and each all-reduces, no_sync()
    on its first M-1: one all-reduce a step, the same optimizer step and batch, counted whole
    (its time, not its exposed part: how much of it the last micro-batch's backward hides is
    not what the M measured show; ddp_allreduce_bound.py --accumulate 4 on 2 ranks: 2.28x
    estimated, 1.66-1.91x measured quiet, 2.09-2.17x loaded: a lone all-reduce after
    accumulated micro-batches took 1.6x one of the four here)."""
    if micro_batches > 1:
        return _what_if(m, "no_sync", f"no_sync() on {micro_batches - 1} of the job's "
                        f"{micro_batches} micro-batches a step", m.comm_s / micro_batches,
                        f"the job accumulates {micro_batches} micro-batches a step and each "
                        "all-reduces its gradients; its optimizer step and batch stay as they "
                        "are", value=micro_batches)
    exposed = m.exposed_s / every
    return _what_if(m, "no_sync", f"no_sync() on {every - 1} of {every} steps", exposed,
                    f"the optimizer then steps every {every} batches")


def compress_what_if(m: RankComm) -> WhatIf | None:
    """bf16 compression: half the bytes of fp32 gradients on the wire (None: already half)."""
    if m.fp32_grads is False:
        return None
    comm = m.collective_s(m.bytes_per_step / 2, m.buckets)
    last_s = m.collective_s(m.last_bucket_bytes / 2, 1)
    note = "" if m.fp32_grads else "if the gradients are fp32 (their dtype was not seen)"
    return _what_if(m, "compress", "bf16_compress_hook",
                    m.exposed(comm, last_s, m.capacity_s), note)


@dataclass(frozen=True)
class ScalePoint:
    """The step at ``ranks`` ranks for the same global batch."""

    ranks: int
    step_s: float
    exposed_s: float
    across_nodes: bool

    @property
    def exposed_share(self) -> float:
        return self.exposed_s / self.step_s if self.step_s > 0 else 0.0

    def efficiency(self, base: ScalePoint) -> float:
        """Throughput per rank against ``base`` (1: perfect scaling)."""
        return (base.step_s * base.ranks) / (self.step_s * self.ranks) if self.step_s else 0.0

    @property
    def shown_exposed_share(self) -> float:
        """Its exposed share as verdict.json and the report give it (four places)."""
        return round(self.exposed_share, 4)


def scaling(m: RankComm, ranks: tuple[int, ...] = SCALES, *,
            link: LinkFit | None = None, ranks_per_node: int | None = None) -> list[ScalePoint]:
    """The step at N ranks for the same global batch (strong scaling), the measured world
    first: the work outside communication divided by N/n, the all-reduce at N ranks (its bus
    share grows to 2(N-1)/N, its latency with the N-1 hops of the ring), its overlap capacity
    shrinking with backward. ``link``: the bus bandwidth between nodes, used past
    ``ranks_per_node``."""
    out = [ScalePoint(m.world, m.step_s, m.exposed_s, False)]
    for n in (r for r in ranks if r > m.world):
        ratio = m.world / n
        hops = (n - 1) / max(m.world - 1, 1)
        across = link is not None and ranks_per_node is not None and n > ranks_per_node
        base = m
        if across and link is not None:
            base = replace(m, link=replace(m.link, beta_bytes_s=link.beta_bytes_s))
        comm = base.collective_s(m.bytes_per_step, m.buckets, world=n, alpha_factor=hops)
        last_s = base.collective_s(m.last_bucket_bytes, 1, world=n, alpha_factor=hops)
        exposed = m.exposed(comm, last_s, m.capacity_s * ratio)
        out.append(ScalePoint(n, (m.step_s - m.exposed_s) * ratio + exposed, exposed, across))
    return out


def _part(some: pd.Series, whole: pd.Series) -> float:
    total = float(whole.sum())
    return float(some.sum()) / total if total > 0 else 1.0


def _num(row: pd.Series | None, col: str) -> float | None:
    if row is None or col not in row:
        return None
    value = row[col]
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value > 0 else None


def _fp32(row: pd.Series | None) -> bool | None:
    if row is None or not isinstance(row.get("dtypes"), str) or not row["dtypes"]:
        return None
    kinds = [d.strip().lower() for d in row["dtypes"].split(",")]
    return not all(d in HALF_DTYPES for d in kinds)
