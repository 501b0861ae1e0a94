"""What each rank's collectives moved, how fast, and why the exposed ones were slow.

From the collectives of each rank's profiler window (doctor.trace.comm_calls), per rank and kind
of collective: calls, bytes, time, the part no compute overlapped (exposed), and the median bus
bandwidth. Each exposed collective is classed:

- ``waiting``: it started well before the last rank started the same collective (the same kind,
  the same ordinal on every rank), so most of its time went to waiting for the others; the slow
  rank is the cause, not the link;
- ``latency``: its message is too small for the link's bandwidth to matter (under
  ``LATENCY_BYTES``): many small collectives cost a round trip each;
- ``bandwidth``: otherwise, moving its bytes at the bus bandwidth shown;
- ``unknown``: not waiting, and the trace does not say its size.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from doctor.analyse.comm_model import (
    LinkFit,
    RankComm,
    ScalePoint,
    WhatIf,
    bucket_what_ifs,
    compress_what_if,
    gradient_reduces,
    no_sync_what_if,
    rank_comm,
    scaling,
)
from doctor.analyse.gpus import PCIE_LANE_GB_PER_S
from doctor.analyse.parallelism import (
    Parallelism,
    RoleCost,
    deepspeed_config,
    parallelism,
    role_costs,
    roles,
    tensor_parallel_seen,
)
from doctor.analyse.steps import RankSteps
from doctor.store.rundata import RunData, RunRecord

if TYPE_CHECKING:
    from doctor.analyse.stages import JobFacts

#: Below this a message's transfer time is small against a collective's round trips (NCCL's
#: low-latency protocol is used up to about this size; gloo's TCP rounds cost more).
LATENCY_BYTES = 256 * 1024
#: A collective that started this share of its time before the last rank's is waiting.
WAITING_SHARE = 0.5
WAITING, LATENCY, BANDWIDTH = "waiting", "latency", "bandwidth"
UNKNOWN = "unknown"  # neither waiting nor of a known size
SHOWN = ("rank", "kind", "role", "calls", "bytes", "time_s", "exposed_s", "bus_gb_per_s",
         "waiting_s", "bound", "link", "of_link")


#: NVLink bandwidth per link and direction, GB/s, by NVLink version (V100: 2, A100: 3,
#: H100: 4, B200: 5); PCIe's per lane: doctor.analyse.gpus.PCIE_LANE_GB_PER_S.
NVLINK_GB_PER_S = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 50.0}


@dataclass(frozen=True)
class Link:
    """The link a rank's collectives run over, as far as it is known."""

    name: str  # "NVLink 4 x18", "PCIe 5 x16", "TCP loopback", "network (eth0)"
    gb_per_s: float  # one direction
    source: str  # "NVML", "measured", "stated (DOCTOR_LINK_GBPS)", "interface speed"
    across_nodes: bool = False

    @property
    def shown_gb_per_s(self) -> float:
        """Its bandwidth as verdict.json and the report give it (to the MB/s)."""
        return round(self.gb_per_s, 3)


def node_link(record: RunRecord, on_gpu: bool) -> Link | None:
    """The link between ranks of one node: the GPUs' NVLink or PCIe (NVML), or TCP loopback
    (measured after the job) for collectives on the CPU."""
    if on_gpu:
        for g in record.gpus:
            links, version = g.get("nvlinks"), g.get("nvlink_version")
            if isinstance(links, int | float) and links > 0:
                v = int(version) if isinstance(version, int | float) and version == version else 0
                return Link(f"NVLink {v or '?'} x{int(links)}",
                            int(links) * NVLINK_GB_PER_S.get(v, 25.0), "NVML")
            gen, width = g.get("pcie_gen_max"), g.get("pcie_width_max")
            if isinstance(gen, int | float) and isinstance(width, int | float) and \
                    int(gen) in PCIE_LANE_GB_PER_S and width > 0:
                return Link(f"PCIe {int(gen)} x{int(width)}",
                            PCIE_LANE_GB_PER_S[int(gen)] * width, "NVML")
        return None
    loop = (record.links or {}).get("loopback_gb_per_s")
    if isinstance(loop, int | float) and loop > 0:
        return Link("TCP loopback", float(loop), "measured")
    return None


def network_link(record: RunRecord) -> Link | None:
    """The link between nodes: a figure the user stated (``DOCTOR_LINK_GBPS``), else the
    fastest network interface's speed."""
    links = record.links or {}
    stated, nic = links.get("stated_gb_per_s"), links.get("nic_gb_per_s")
    if isinstance(stated, int | float) and stated > 0:
        return Link("network", float(stated), "stated (DOCTOR_LINK_GBPS)", True)
    if isinstance(nic, int | float) and nic > 0:
        return Link(f"network ({links.get('nic', '?')})", float(nic), "interface speed", True)
    return None


@dataclass(frozen=True)
class RankComms:
    rank: int
    calls: pd.DataFrame  # one row per collective, with waiting_s and bound
    window_s: float  # the profiled steps' time, for per-step figures
    link: Link | None = None  # what its collectives run over, where known
    steps: int = 0  # the profiled steps, for per-step figures

    def roles(self) -> dict[str, RoleCost]:
        """Its collectives by role (doctor.analyse.parallelism), per window step."""
        return role_costs(self.calls, self.steps)

    @property
    def on_gpu(self) -> bool:
        """Whether its collectives ran on a GPU (NCCL kernels), not on the CPU (gloo)."""
        return bool(self.calls["on_gpu"].any()) if "on_gpu" in self.calls else False

    def by_kind(self) -> pd.DataFrame:
        """Per kind of collective: calls, bytes, time, exposed, median bus bandwidth (GB/s), time
        waiting, and the class with the most exposed time."""
        c = self.calls
        if c.empty:
            return pd.DataFrame(columns=list(SHOWN))
        if "role" not in c:
            c = c.assign(role="")
        g = c.groupby(["kind", "role"], sort=False)
        out = pd.DataFrame({
            "calls": g.size(), "bytes": g["bytes"].sum(min_count=1),
            "time_s": g["seconds"].sum(), "exposed_s": g["exposed_s"].sum(),
            "bus_gb_per_s": g["bus_bytes_s"].median() / 1e9, "waiting_s": g["waiting_s"].sum(),
        }).reset_index()
        out["bound"] = [_main_bound(c[(c["kind"] == k) & (c["role"] == r)])
                        for k, r in zip(out["kind"], out["role"], strict=True)]
        out["link"] = self.link.name if self.link else ""
        out["of_link"] = out["bus_gb_per_s"] / self.link.gb_per_s if self.link else np.nan
        out.insert(0, "rank", self.rank)
        return out.sort_values("exposed_s", ascending=False).reset_index(drop=True)

    def exposed_by_bound(self) -> dict[str, float]:
        c = self.calls
        return {str(k): float(v) for k, v in c.groupby("bound")["exposed_s"].sum().items()}



def _main_bound(calls: pd.DataFrame) -> str:
    by = calls.groupby("bound")["exposed_s"].sum()
    return str(by.idxmax()) if len(by) and float(by.max()) > 0 else ""


def waiting_times(calls: pd.DataFrame) -> pd.Series:
    """Per collective (index of ``calls``, rows of every rank), how long it waited for the last
    rank to start the same collective: the same kind and ordinal on each rank, matched only
    where every rank has the same count of that kind."""
    out = pd.Series(0.0, index=calls.index)
    if calls.empty or calls["rank"].nunique() < 2:
        return out
    for _kind, same in calls.groupby("kind"):
        counts = same.groupby("rank").size()
        if counts.nunique() != 1:
            continue  # the ranks' windows hold different collectives: no match by ordinal
        ordinal = same.sort_values("start_us").groupby("rank").cumcount()
        last = same["start_us"].groupby(ordinal).transform("max")
        out.loc[same.index] = np.minimum((last - same["start_us"]) * 1e-6, same["seconds"])
    return out


def classify(calls: pd.DataFrame, waited: pd.Series) -> pd.DataFrame:
    out = calls.assign(waiting_s=waited)
    small = out["bytes"].notna() & (out["bytes"] < LATENCY_BYTES)
    waiting = out["waiting_s"] >= WAITING_SHARE * out["seconds"]
    known = out["bytes"].notna()
    out["bound"] = np.where(waiting, WAITING, np.where(
        small, LATENCY, np.where(known, BANDWIDTH, UNKNOWN)))
    return out


def comms_evidence(run: RunData, ranks: Mapping[int, RankSteps], window: pd.DataFrame
                   ) -> dict[int, RankComms]:
    """Every rank's collectives (see the module docstring); ranks without any are left out."""
    frame = run.collectives
    if frame.empty:
        return {}
    mains = {(m.node, m.pid): rank for rank, m in ranks.items()}
    keep = [(int(n), int(p)) in mains for n, p in zip(frame["node"], frame["pid"], strict=True)]
    calls = frame[keep].copy()
    if calls.empty:
        return {}
    calls["rank"] = [mains[(int(n), int(p))] for n, p in
                     zip(calls["node"], calls["pid"], strict=True)]
    calls = classify(calls, waiting_times(calls))
    calls["role"] = roles(calls, deepspeed=deepspeed_config(run.sharding) is not None,
                          tensor_parallel=tensor_parallel_seen(run.sharding))
    nodes = {m.node for m in ranks.values()}
    hosts = {run.record.nodes[n] for n in nodes if n < len(run.record.nodes)}
    one_host = len(hosts) == 1 and None not in hosts  # nodes side by side (a test, loopback)
    across_nodes = len(nodes) > 1 and not one_host
    out = {}
    for rank in sorted(set(calls["rank"])):
        mine = calls[calls["rank"] == rank]
        steps = window[window["rank"] == rank] if "rank" in window else window
        window_s = float(steps["dur_s"].sum()) if "dur_s" in steps and len(steps) else 0.0
        comms = RankComms(rank, mine.reset_index(drop=True), window_s, steps=len(steps))
        link = network_link(run.record) if across_nodes else node_link(run.record, comms.on_gpu)
        out[rank] = replace(comms, link=link)
    return out


def comms_parallelism(comms: Mapping[int, RankComms], world: int | None, ddp_seen: bool,
                      probe: pd.DataFrame | None = None,
                      schedules: pd.DataFrame | None = None) -> Parallelism:
    """The job's parallelism (doctor.analyse.parallelism) from every rank's collectives, the
    FSDP modules the job built (``probe``: RunData.sharding) and its pipeline schedules
    (``schedules``: RunData.pipeline)."""
    calls = pd.concat([c.calls for c in comms.values()], ignore_index=True) if comms else \
        pd.DataFrame()
    return parallelism(calls, {r: c.steps for r, c in comms.items()}, world, ddp_seen, probe,
                       schedules)


def comms_table(comms: Mapping[int, RankComms]) -> dict[str, pd.DataFrame]:
    """The report's table (none without collectives): every rank's collectives by kind."""
    parts = [c.by_kind() for _, c in sorted(comms.items())]
    return {"communication": pd.concat(parts, ignore_index=True)} if parts else {}


#: What-ifs whose predicted speedups are this close are a tie for the model (CommModel.best).
TIE = 0.02


@dataclass(frozen=True)
class CommModel:
    """The communication model of one rank (doctor.analyse.comm_model) and what it predicts."""

    model: RankComm
    what_ifs: tuple[WhatIf, ...]
    scaling: tuple[ScalePoint, ...]
    link: Link | None = None

    @property
    def bus_gb_per_s(self) -> float:
        """The bus bandwidth its fit gives (GB/s)."""
        return self.model.link.beta_bytes_s / 1e9

    @property
    def exposed_share(self) -> float | None:
        """Its exposed communication's share of the step (None: no step time)."""
        m = self.model
        return m.exposed_s / m.step_s if m.step_s else None

    @property
    def of_link(self) -> float | None:
        """Its bus bandwidth's share of its link's (None: the link is not known)."""
        if self.link is None or not self.link.shown_gb_per_s:
            return None
        return self.bus_gb_per_s / self.link.shown_gb_per_s

    def far_point(self, times: int = 4) -> ScalePoint | None:
        """The first point of its scaling at ``times`` its world or more (None: none)."""
        return next((p for p in self.scaling if p.ranks >= times * self.model.world), None)

    def best(self, fix: str) -> WhatIf | None:
        """The what-if of ``fix`` the model gives most for; among those within TIE of it, the
        one with the largest value (for bucket caps: the fewest calls, whose latency the model
        fits least surely). Two caps the model cannot tell apart, a few buckets with overlap
        against one bucket without, are otherwise chosen by noise in the measured overlap."""
        same = [w for w in self.what_ifs if w.fix == fix]
        if not same:
            return None
        top = max(w.speedup for w in same)
        near = [w for w in same if w.speedup >= top * (1 - TIE)]
        return max(near, key=lambda w: (w.value or 0.0, w.speedup))

    def table(self) -> pd.DataFrame:
        rows = [{"rank": self.model.rank, "change": w.setting, "exposed_s": w.exposed_s,
                 "step_s": w.step_s, "speedup": w.speedup, "note": w.note}
                for w in self.what_ifs]
        base = self.scaling[0] if self.scaling else None
        rows += [{"rank": self.model.rank, "change": f"{p.ranks} ranks, same global batch",
                  "exposed_s": p.exposed_s, "step_s": p.step_s,
                  "speedup": self.model.step_s / p.step_s if p.step_s else 0.0,
                  "note": f"{p.exposed_share:.0%} of the step exposed; scaling efficiency "
                          f"{p.efficiency(base):.0%}" + (" (across nodes)" if p.across_nodes
                                                          else "")}
                 for p in self.scaling[1:] if base is not None]
        return pd.DataFrame(rows)



def comm_models(run: RunData, comms: Mapping[int, RankComms], window: pd.DataFrame,
                job: JobFacts, inter_node: LinkFit | None = None,
                micro_batches: Mapping[int, float] | None = None) -> dict[int, CommModel]:
    """Each rank's model, from its window's analysed steps, its collectives and its DDP
    settings; a rank's waits for a slower rank (its time waiting in collectives beyond the
    least-waiting rank's) are taken out of its exposed time first. ``inter_node``: the link
    between nodes, for the scaling past one node; ``micro_batches``: each rank's backward()
    calls a step (the ledger's median), for the no_sync() of a job that accumulates."""
    world = job.world_size if isinstance(job.world_size, int) else len(comms)
    # every rank waits a little in each collective for its peers (jitter, the ring's own
    # rounds): only the wait beyond the least-waiting rank's is for a slower rank
    least_wait = min(float(c.calls["waiting_s"].sum()) for c in comms.values()) if comms else 0
    out: dict[int, CommModel] = {}
    for rank, c in comms.items():
        steps = window[window["rank"] == rank] if "rank" in window else window
        if "analyzed" in steps:
            steps = steps[steps["analyzed"].astype(bool)]
        if steps.empty:
            continue
        pids = set(c.calls["pid"]) if "pid" in c.calls else set()
        ddp = run.ddp[run.ddp["pid"].isin(pids)] if not run.ddp.empty else run.ddp
        spare = 1.0 if c.on_gpu or not job.cores else job.cores / max(job.ranks_here, 1) - 1.0
        waited = (float(c.calls["waiting_s"].sum()) - least_wait) / len(steps)
        groups = c.calls.loc[gradient_reduces(c.calls), "group"] \
            if "group" in c.calls else pd.Series(dtype=float)
        groups = groups[groups > 1]
        # the group the all-reduces ran in, as the trace says it; else the job's world
        group = int(groups.median()) if len(groups) else world
        model = rank_comm(rank, group, steps, sized_by_ddp(c.calls, ddp), ddp, waited_s=waited,
                          overlap_cores=spare,
                          link_bytes_s=c.link.gb_per_s * 1e9 if c.link else None)
        if model is None:
            continue
        accumulates = each_micro_batch_reduces(model, (micro_batches or {}).get(rank), ddp)
        fixes = [*bucket_what_ifs(model)]
        if accumulates != 0:  # 0: the job's micro-batches already skip the all-reduce
            fixes.append(no_sync_what_if(model, micro_batches=accumulates or 1))
        if (w := compress_what_if(model)) is not None:
            fixes.append(w)
        points = scaling(model, link=inter_node, ranks_per_node=job.ranks_here)
        out[rank] = CommModel(model, tuple(fixes), tuple(points), c.link)
    return out


def each_micro_batch_reduces(model: RankComm, micro: float | None, ddp: pd.DataFrame
                             ) -> int | None:
    """For a rank that accumulates M (``micro``, rounded) micro-batches a step: M where each
    all-reduces its gradients (the all-reduces a step are M times DDP's buckets, or at least M
    where DDP's buckets are not known), 0 where they do not (no_sync() already); None where
    the job does not accumulate."""
    if micro is None or micro != micro or round(micro) < 2:
        return None
    m = round(micro)
    buckets = float(ddp["buckets"].iloc[0]) if not ddp.empty and "buckets" in ddp else 0.0
    each = model.calls_per_step >= (0.75 * m * buckets if buckets > 0 else m)
    return m if each else 0


def sized_by_ddp(calls: pd.DataFrame, ddp: pd.DataFrame) -> pd.DataFrame:
    """The all-reduces whose size the trace does not give (older GPU traces), given DDP's mean
    bucket (doctor.probes.ddp: DDP all-reduces each of its buckets once a step)."""
    if ddp.empty or calls.empty:
        return calls
    row = ddp.iloc[0]
    unsized = gradient_reduces(calls) & calls["bytes"].isna()
    if not unsized.any() or not (row["buckets"] > 0 and row["bucket_bytes"] > 0):
        return calls
    return calls.assign(bytes=calls["bytes"].mask(unsized, row["bucket_bytes"] / row["buckets"]))


def inter_node_link(record: RunRecord) -> LinkFit | None:
    """The link between nodes as a bus bandwidth (network_link), for the scaling past one
    node; None when it is not known (the scaling then keeps the link measured between the
    ranks)."""
    link = network_link(record)
    return LinkFit(0.0, link.gb_per_s * 1e9, 0, link.source) if link is not None else None


def critical(models: Mapping[int, CommModel]) -> CommModel | None:
    """The rank on the critical path: the one with the most exposed communication once waits
    for slower ranks are taken out (the ranks that wait have slack; this one does not)."""
    if not models:
        return None
    return max(models.values(), key=lambda m: (m.model.exposed_s, -m.model.rank))
