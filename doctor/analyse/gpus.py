"""The GPU counters stage: NVML's samples over the analysed steps, per GPU, and which GPU each
rank ran on.

The parent samples every GPU of the machine at 2 Hz for the whole run (doctor.probes.gpu). Here
those samples become one summary per GPU over the span of the analysed steps (utilisation,
memory, PCIe, clocks against their maximum, power against its limit, throttling, the GPM
metrics), each rank is mapped to its GPU, and each sample gets the step of the rank it served.
Nothing here decides anything: the rules (doctor.rules.gpu_counters) read it.

A rank's GPU comes from, in order: the CUDA device its training process had current at exit (its
uuid; this also serves a container whose PID namespace NVML does not share), NVML's process list
(the GPU where the process held the most memory), or the only GPU of its node.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from doctor.analyse.contention import analysed_span, within
from doctor.analyse.step_table import analysed
from doctor.analyse.steps import WINDOW, RankSteps
from doctor.store.rundata import RunData

Gpu = tuple[int, int]  # (node, index as NVML counts them)

#: Clock event reasons (nvml.h): the bits that mean the clocks were held down.
POWER_BITS = 0x04 | 0x80  # software power cap, hardware power brake
THERMAL_BITS = 0x20 | 0x40  # software and hardware thermal slowdown
HW_SLOWDOWN_BIT = 0x08  # hardware slowdown (power or thermal, the board does not say which)
#: PCIe bandwidth per lane and direction, GB/s, by generation (after encoding); the one table
#: (doctor.analyse.comms reads a node's link from it too).
PCIE_LANE_GB_PER_S = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
IDLE_UTIL_PCT = 5.0  # a GPU below this all run long did nothing


@dataclass(frozen=True)
class GpuSummary:
    """One GPU over the analysed span. Shares are fractions of its samples; NaN: not known."""

    node: int
    index: int
    name: str
    uuid: str
    samples: int
    util: float  # mean fraction of time a kernel ran (NVML utilization.gpu / 100)
    mem_used_mean_bytes: float
    mem_used_max_bytes: float
    mem_total_bytes: float
    pcie_rx_bytes_s: float  # host to device
    pcie_tx_bytes_s: float  # device to host
    pcie_link_bytes_s: float  # the link's bandwidth per direction at its maximum generation
    sm_clock_mhz: float  # mean while busy
    sm_clock_max_mhz: float
    power_w: float
    power_limit_w: float
    power_limit_max_w: float  # the highest the board allows
    temp_max_c: float
    power_throttled: float
    thermal_throttled: float
    hw_slowdown: float
    gpm: Mapping[str, float] = field(default_factory=dict)  # sm_active, tensor_active, dram_bw
    gpm_reason: str = ""
    ranks: tuple[int, ...] = ()  # ranks of the job that ran on it
    other_pids: int = 0  # processes outside the job NVML saw on it
    job_pids: int = 0  # the job's processes NVML saw on it (a rank's own, or a stray context)

    @property
    def key(self) -> Gpu:
        return (self.node, self.index)

    @property
    def held_share(self) -> float:
        """Share of its samples with the clocks held down by power or temperature (0 unknown)."""
        return max(_zero(self.power_throttled), _zero(self.thermal_throttled))

    @property
    def clock_ratio(self) -> float:
        ok = self.sm_clock_max_mhz > 0 and not math.isnan(self.sm_clock_mhz)
        return self.sm_clock_mhz / self.sm_clock_max_mhz if ok else float("nan")

    @property
    def pcie_busy(self) -> float:
        """Fraction of the time the link carried copies, were they all at its full rate."""
        if not self.pcie_link_bytes_s > 0:
            return float("nan")
        # full duplex: each direction has the link's bandwidth; the busier one bounds the time
        return max(_zero(self.pcie_rx_bytes_s), _zero(self.pcie_tx_bytes_s)) \
            / self.pcie_link_bytes_s



@dataclass(frozen=True)
class GpuCounters:
    """Every GPU the parent sampled, and which ranks ran where."""

    gpus: tuple[GpuSummary, ...]
    rank_gpu: Mapping[int, Gpu]  # rank -> its GPU
    mapped_by: str  # the ways used: "nvml processes", "cuda device", "one gpu" ("": none)
    samples: pd.DataFrame  # the analysed span's samples, with ``rank`` and ``step`` (-1: none)
    notes: tuple[str, ...] = ()
    visible: str | None = None  # the job's CUDA_VISIBLE_DEVICES (None: every GPU)

    def gpu(self, key: Gpu | None) -> GpuSummary | None:
        """The summary of one GPU (None: it had no samples in the analysed span)."""
        return next((g for g in self.gpus if g.key == key), None)

    def of_rank(self, rank: int) -> GpuSummary | None:
        return self.gpu(self.rank_gpu.get(rank))

    def unused(self) -> list[GpuSummary]:
        """GPUs of a node the job ran on that the job could see, that no rank used, nothing
        else used, and that stayed idle."""
        used = set(self.rank_gpu.values())
        nodes = {node for node, _ in used}
        return [g for g in self.gpus if g.node in nodes and g.key not in used
                and g.other_pids == 0 and g.job_pids == 0 and g.util * 100 < IDLE_UTIL_PCT
                and _visible(g, self.visible)]


def gpu_counters(run: RunData, ranks: Mapping[int, RankSteps], steps: pd.DataFrame
                 ) -> GpuCounters | None:
    """The GPU counters of the run over the span of its analysed steps; ``steps`` the step
    table (rank, step, start_s, wall_s, analyzed). Steps that are the profiler window's own
    count on the trace's clock, not the run's: they neither bound the span nor get samples.
    None where no GPU was sampled."""
    if run.gpu.empty:
        return None
    on_run_clock = [rank for rank, r in ranks.items() if r.kind != WINDOW]
    steps = steps[steps["rank"].isin(on_run_clock)]
    span = analysed_span(analysed(steps)) if not steps.empty else None
    samples = within(run.gpu, span)
    if samples.empty:
        samples = run.gpu
    rank_gpu, mapped_by, notes = _rank_gpus(run, ranks)
    by_gpu: dict[Gpu, list[int]] = {}
    for rank, key in sorted(rank_gpu.items()):
        by_gpu.setdefault(key, []).append(rank)
    info = {(int(g.get("node", 0)), int(g.get("index", -1))): g for g in run.record.gpus}
    job_pids = {(r.node, r.pid) for r in ranks.values()}
    gpus = []
    for (node, index), rows in samples.groupby(["node", "gpu"], sort=True):
        key = (int(node), int(index))  # type: ignore[call-overload]
        gpus.append(_summary(key, rows, info.get(key, {}), tuple(by_gpu.get(key, ())),
                             *_pids_on(run.gpu_procs, key, job_pids)))
    reasons = {g.gpm_reason for g in gpus if g.gpm_reason}
    if reasons:
        notes.append(f"GPM metrics: {sorted(reasons)[0]}.")
    return GpuCounters(gpus=tuple(gpus), rank_gpu=rank_gpu, mapped_by=mapped_by,
                       samples=_with_steps(samples, rank_gpu, steps), notes=tuple(notes),
                       visible=run.record.visible_devices)


def gpu_tables(counters: GpuCounters | None) -> dict[str, pd.DataFrame]:
    """The report's tables: one row per GPU (``ranks``: the ranks on it, a tuple), and each GPU
    over the run in tenths of it (``steps``: the first and last step of its rank they cover, a
    pair, () for none; utilisation and memory). Numbers only: reports.tables words them."""
    if counters is None:
        return {}
    nodes = len({g.node for g in counters.gpus}) > 1
    rows = []
    for g in counters.gpus:
        rows.append({
            **({"node": g.node} if nodes else {}), "gpu": g.index, "name": g.name,
            "ranks": tuple(g.ranks), "util_pct": 100 * g.util,
            "memory_used_max_bytes": g.mem_used_max_bytes,
            "memory_total_bytes": g.mem_total_bytes,
            "pcie_rx_mb_per_s": g.pcie_rx_bytes_s / 2**20,
            "pcie_tx_mb_per_s": g.pcie_tx_bytes_s / 2**20,
            "sm_clock_of_max_pct": 100 * g.clock_ratio, "power_w": g.power_w,
            "power_limit_w": g.power_limit_w,
            "throttled_share": g.held_share,
            "gpm_sm_active_pct": 100 * g.gpm.get("sm_active", float("nan")),
            "gpm_tensor_active_pct": 100 * g.gpm.get("tensor_active", float("nan")),
            "gpm_dram_bw_pct": 100 * g.gpm.get("dram_bw", float("nan")),
        })
    table = pd.DataFrame(rows).dropna(axis=1, how="all")
    return {"gpus": table, "gpu_over_run": _over_run(counters.samples, nodes)}


def _over_run(samples: pd.DataFrame, nodes: bool) -> pd.DataFrame:
    if samples.empty:
        return pd.DataFrame()
    parts = []
    for (node, index), rows in samples.groupby(["node", "gpu"], sort=True):
        t = rows["t_s"].to_numpy(np.float64)
        tenth = np.minimum(((t - t.min()) / max(float(np.ptp(t)), 1e-9) * 10).astype(int), 9)
        for _tenth, chunk in rows.groupby(tenth, sort=True):
            steps = chunk["step"][chunk["step"] >= 0]
            parts.append({
                **({"node": node} if nodes else {}), "gpu": index,
                "from_s": float(chunk["t_s"].min()), "to_s": float(chunk["t_s"].max()),
                "steps": (int(steps.min()), int(steps.max())) if len(steps) else (),
                "util_pct": _mean(chunk["util_pct"]),
                "memory_used_bytes": _max(chunk["mem_used_bytes"]),
                "memory_used_pct": 100 * _max(chunk["mem_used_bytes"])
                / _max(chunk["mem_total_bytes"]),
                "pcie_rx_mb_per_s": _mean(chunk["pcie_rx_kbps"]) / 1024,
            })
    return pd.DataFrame(parts).dropna(axis=1, how="all")


def _summary(key: Gpu, rows: pd.DataFrame, info: Mapping[str, Any], ranks: tuple[int, ...],
             other_pids: int, job_pids: int) -> GpuSummary:
    util = rows["util_pct"].to_numpy(np.float64)
    busy = rows[rows["util_pct"] >= 50]
    reasons = rows["throttle_reasons"].dropna().to_numpy(np.float64).astype(np.int64)
    gen, width = _float(info.get("pcie_gen_max")), _float(info.get("pcie_width_max"))
    link = PCIE_LANE_GB_PER_S.get(int(gen), float("nan")) * width * 1e9 \
        if not (math.isnan(gen) or math.isnan(width)) else float("nan")
    total = _float(info.get("memory_total_bytes"))
    return GpuSummary(
        node=key[0], index=key[1], name=str(info.get("name") or ""),
        uuid=str(info.get("uuid") or ""), samples=len(rows),
        util=_mean(util) / 100.0,
        mem_used_mean_bytes=_mean(rows["mem_used_bytes"]),
        mem_used_max_bytes=_max(rows["mem_used_bytes"]),
        mem_total_bytes=total if not math.isnan(total) else _max(rows["mem_total_bytes"]),
        pcie_rx_bytes_s=_mean(rows["pcie_rx_kbps"]) * 1024,
        pcie_tx_bytes_s=_mean(rows["pcie_tx_kbps"]) * 1024,
        pcie_link_bytes_s=link,
        sm_clock_mhz=_mean(busy["sm_clock_mhz"]) if len(busy) else float("nan"),
        sm_clock_max_mhz=_float(info.get("sm_clock_max_mhz")),
        power_w=_mean(rows["power_w"]), power_limit_w=_float(info.get("power_limit_w")),
        power_limit_max_w=_float(info.get("power_limit_max_w")),
        temp_max_c=_max(rows["temp_c"]),
        power_throttled=_share(reasons, POWER_BITS),
        thermal_throttled=_share(reasons, THERMAL_BITS),
        hw_slowdown=_share(reasons, HW_SLOWDOWN_BIT),
        gpm={k: v / 100.0 for k, v in (("sm_active", _mean(rows["gpm_sm_active_pct"])),
                                       ("tensor_active", _mean(rows["gpm_tensor_active_pct"])),
                                       ("dram_bw", _mean(rows["gpm_dram_bw_pct"])))
             if not math.isnan(v)},
        gpm_reason=str(info.get("gpm_reason") or ""), ranks=ranks, other_pids=other_pids,
        job_pids=job_pids,
    )


def _rank_gpus(run: RunData, ranks: Mapping[int, RankSteps]
               ) -> tuple[dict[int, Gpu], str, list[str]]:
    """Each rank's GPU, by the first of the three ways (module docstring) that knows it; the
    ways that were used; a note where NVML's process list had none of the job's processes."""
    uuids = {(int(g.get("node", 0)), _uuid(g.get("uuid"))): int(g.get("index", -1))
             for g in run.record.gpus if g.get("uuid")}
    procs = run.gpu_procs
    per_node = run.gpu.groupby("node")["gpu"].nunique()

    def cuda_device(r: RankSteps, process: pd.Series) -> Gpu | None:
        key = (r.node, _uuid(process["cuda_uuid"]))
        return (r.node, uuids[key]) if key[1] and key in uuids else None

    def nvml_processes(r: RankSteps, process: pd.Series) -> Gpu | None:
        mine = procs[(procs["node"] == r.node) & (procs["pid"] == r.pid)]
        if mine.empty:
            return None
        # where it holds the most memory (a stray context on GPU 0 beside its own GPU is
        # common), else where it was seen most often
        memory = mine.groupby("gpu")["used_bytes"].max().fillna(0.0)
        counts = mine["gpu"].value_counts()
        return r.node, int(max(memory.index, key=lambda g: (memory[g], counts[g])))

    def one_gpu(r: RankSteps, process: pd.Series) -> Gpu | None:
        if per_node.get(r.node) != 1 or not said_cuda(process):
            return None
        return r.node, int(run.gpu.loc[run.gpu["node"] == r.node, "gpu"].iloc[0])

    processes = {rank: rows.iloc[0] for rank, r in ranks.items()
                 if not (rows := run.rows("processes", r.process)).empty}
    found: dict[int, Gpu] = {}
    ways: list[str] = []
    for name, way in (("cuda device", cuda_device), ("nvml processes", nvml_processes),
                      ("one gpu", one_gpu)):
        more = {rank: gpu for rank, process in processes.items() if rank not in found
                and (gpu := way(ranks[rank], process)) is not None}
        if more:
            found.update(more)
            ways.append(name)
    notes: list[str] = []
    job = {(r.node, r.pid) for r in ranks.values()}
    listed = set(zip(procs["node"].astype(int), procs["pid"].astype(int), strict=True))
    if listed and not job & listed and found:
        notes.append("NVML listed processes on the GPUs, but none of the job's: the job may run "
                     "in its own PID namespace (a container); ranks were matched to GPUs by "
                     "the CUDA device each recorded.")
    return found, ", ".join(ways), notes


def said_cuda(process: pd.Series) -> bool:
    """Whether a process (a row of the processes frame) computed on a GPU, as it said at its
    exit (CUDA initialised); one that did not say (a crash, an older doctor): whether torch saw
    a GPU at all."""
    said = process["cuda_initialized"]
    said = said if said is not None else process["cuda"]
    return isinstance(said, bool | np.bool_) and bool(said)


def _pids_on(procs: pd.DataFrame, key: Gpu, job: set[tuple[int, int]]) -> tuple[int, int]:
    """(processes outside the job, processes of the job) NVML saw on one GPU."""
    if procs.empty:
        return 0, 0
    rows = procs[(procs["node"] == key[0]) & (procs["gpu"] == key[1])]
    seen = {int(p) for p in rows["pid"]}
    mine = {p for n, p in job if n == key[0]}
    return len(seen - mine), len(seen & mine)


def _with_steps(samples: pd.DataFrame, rank_gpu: Mapping[int, Gpu], steps: pd.DataFrame
                ) -> pd.DataFrame:
    """Each sample with the lowest rank its GPU served and that rank's step at that moment."""
    out = samples.assign(rank=-1, step=-1)
    first_rank: dict[Gpu, int] = {}
    for rank, key in sorted(rank_gpu.items()):
        first_rank.setdefault(key, rank)
    for key, rank in first_rank.items():
        mine = steps[steps["rank"] == rank].sort_values("start_s")
        rows = (out["node"] == key[0]) & (out["gpu"] == key[1])
        if mine.empty or not rows.any():
            continue
        t = out.loc[rows, "t_s"].to_numpy(np.float64)
        starts = mine["start_s"].to_numpy(np.float64)
        ends = starts + mine["wall_s"].to_numpy(np.float64)
        at = np.searchsorted(starts, t, side="right") - 1
        inside = (at >= 0) & (t <= ends[np.clip(at, 0, None)])
        numbers = mine["step"].to_numpy(np.int64)
        out.loc[rows, "rank"] = rank
        out.loc[rows, "step"] = np.where(inside, numbers[np.clip(at, 0, None)], -1)
    return out


def _visible(gpu: GpuSummary, visible: str | None) -> bool:
    """Whether CUDA_VISIBLE_DEVICES lets the job see it, as far as it can be told: a uuid (or its
    prefix) names a GPU; an index counts in CUDA's own order, which need not be NVML's (unless
    CUDA_DEVICE_ORDER=PCI_BUS_ID), so a GPU named by index is not claimed visible."""
    if visible is None:
        return True
    for item in (v.strip() for v in visible.split(",")):
        if item and not item.isdigit() and gpu.uuid and _uuid(gpu.uuid).startswith(_uuid(item)):
            return True
    return False


def _uuid(value: object) -> str:
    text = str(value or "").strip().lower()
    return text.removeprefix("gpu-")


def _share(reasons: np.ndarray, bits: int) -> float:
    return float(((reasons & bits) != 0).mean()) if len(reasons) else float("nan")


def _mean(values: Any) -> float:
    arr = np.asarray(values, dtype=np.float64)
    arr = arr[~np.isnan(arr)]
    return float(arr.mean()) if len(arr) else float("nan")


def _max(values: Any) -> float:
    arr = np.asarray(values, dtype=np.float64)
    arr = arr[~np.isnan(arr)]
    return float(arr.max()) if len(arr) else float("nan")


def _float(value: Any) -> float:
    try:
        return float(value) if value is not None else float("nan")
    except (TypeError, ValueError):
        return float("nan")


def _zero(value: float) -> float:
    return 0.0 if math.isnan(value) else value
