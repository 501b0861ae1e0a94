"""The JSON report: the verdict exactly as ``verdict.json`` holds it (schema doctor.verdict/1).

The one place where the analysis's typed records become verdict.json's dicts: the verdict's own
keys (doctor.verdict.Verdict.to_dict), then each section of the analysis (``gpus``, ``memory``,
``ops``, ``communication``, ``comm_model``, ``scaling``, ``slow_steps``, ``gc``, ``phases``;
doctor.analyse.analysis.Sections), in that order,
each where the run has it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from doctor.analyse.analysis import Analysis, Sections
from doctor.analyse.causes import CauseGroup, SlowSteps
from doctor.analyse.comm_model import ScalePoint, WhatIf
from doctor.analyse.comms import CommModel, Link, RankComms
from doctor.analyse.gpus import GpuSummary
from doctor.analyse.kind_scaling import KindScaling
from doctor.analyse.memory import KINDS as MEMORY_KINDS
from doctor.analyse.memory import MemoryEvidence, RankMemory
from doctor.analyse.memory_growth import Growth, WorkerGrowth
from doctor.analyse.ops import RankOps
from doctor.analyse.roofline import Roofs
from doctor.analyse.spike_calls import calls_of
from doctor.store.redact import redact_argv
from doctor.verdict import plain


def render_json(analysis: Analysis) -> str:
    """``analysis`` as indented JSON, as ``verdict.json`` holds it (verdict_data)."""
    return json.dumps(verdict_data(analysis), indent=2) + "\n"


def verdict_data(analysis: Analysis) -> dict[str, Any]:
    """The verdict's dict and its sections', with the job's argv's secrets hidden
    (doctor.store.redact), whatever recorded it: what verdict.json and the report's embedded
    verdict hold."""
    data = analysis.verdict.to_dict()
    data.update({k: plain(v) for k, v in sections_data(analysis.sections).items()})
    job = data.get("job")
    if isinstance(job, dict):
        argv = job.get("argv")
        if isinstance(argv, Sequence) and not isinstance(argv, str):
            data["job"] = {**job, "argv": redact_argv(argv)}
    return data


def sections_data(s: Sections) -> dict[str, Any]:
    """Each section the run has, as verdict.json holds it (before doctor.verdict.plain)."""
    return {**({"gpus": [gpu_data(g) for g in s.counters.gpus]} if s.counters else {}),
            **({"memory": memory_data(s.memory)} if s.memory else {}),
            **({"ops": [ops_data(o) for o in s.ops.values()]} if s.ops else {}),
            **({"communication": [comms_data(c) for c in s.comms.values()]} if s.comms else {}),
            **({"comm_model": [model_data(m) for m in s.models.values()]} if s.models else {}),
            **({"scaling": scaling_data(s.scaling)} if s.scaling else {}),
            **({"sharded_phases": [p.to_dict() for _, p in sorted(s.shard_phases.items())]}
               if s.shard_phases else {}),
            **({"slow_steps": slow_steps_data(s.slow_steps)} if s.slow_steps else {}),
            **({"gc": [g.to_dict() for g in s.gc.values()]} if s.gc else {}),
            **({"phases": [p.to_dict() for p in s.phases]} if s.phases else {})}


def gpu_data(g: GpuSummary) -> dict[str, Any]:
    """The verdict's ``gpus`` entry (bytes, fractions, MHz, W; unknown left out)."""
    out: dict[str, Any] = {
        "node": g.node, "index": g.index, "name": g.name, "uuid": g.uuid,
        "ranks": list(g.ranks), "samples": g.samples, "util": g.util,
        "memory_used_mean_bytes": g.mem_used_mean_bytes,
        "memory_used_max_bytes": g.mem_used_max_bytes,
        "memory_total_bytes": g.mem_total_bytes,
        "pcie_rx_bytes_per_s": g.pcie_rx_bytes_s,
        "pcie_tx_bytes_per_s": g.pcie_tx_bytes_s,
        "pcie_link_bytes_per_s": g.pcie_link_bytes_s,
        "sm_clock_mhz": g.sm_clock_mhz, "sm_clock_max_mhz": g.sm_clock_max_mhz,
        "clock_ratio": g.clock_ratio, "power_w": g.power_w,
        "power_limit_w": g.power_limit_w, "power_limit_max_w": g.power_limit_max_w,
        "temperature_max_c": g.temp_max_c,
        "power_throttled_share": g.power_throttled,
        "thermal_throttled_share": g.thermal_throttled,
        "hw_slowdown_share": g.hw_slowdown, "other_processes": g.other_pids,
        **{f"gpm_{k}": v for k, v in g.gpm.items()},
    }
    if g.gpm_reason:
        out["gpm_reason"] = g.gpm_reason
    return {k: v for k, v in out.items()
            if not (isinstance(v, float) and math.isnan(v)) and v != ""}


def memory_data(memory: MemoryEvidence) -> dict[str, Any]:
    """The verdict's ``memory``: each rank's, and the DataLoader workers' growth."""
    return {"ranks": [rank_memory_data(m) for m in memory.ranks.values()],
            "workers": [worker_growth_data(w) for w in memory.workers]}


def rank_memory_data(m: RankMemory) -> dict[str, Any]:
    return {
        "rank": m.rank, "device": m.device,
        **{f"{k}_bytes": m.parts.get(k) for k in MEMORY_KINDS},
        "derived": list(m.derived), "by_dtype": {k: dict(v) for k, v in m.by_dtype.items()},
        "optimizers": list(m.optimizers), "activations_source": m.activations_source,
        "resident_bytes": m.resident_bytes, "allocator": dict(m.allocator),
        "peak_bytes": m.peak_bytes, "peak_source": m.peak_source,
        "capacity_bytes": m.capacity_bytes, "capacity_source": m.capacity_source,
        "machine_peak_bytes": m.machine_peak_bytes,
        "headroom_bytes": m.headroom_bytes, "batch_size": m.batch_size,
        "growth": growth_data(m.growth) if m.growth else None,
    }


def growth_data(g: Growth) -> dict[str, object]:
    return {"source": g.source, "bytes_per_step": g.bytes_per_step,
            "bytes_per_s": g.bytes_per_s, "first_step": g.first_step,
            "last_step": g.last_step, "start_bytes": g.start_bytes,
            "end_bytes": g.end_bytes, "r2": g.r2, "samples": g.samples}


def worker_growth_data(w: WorkerGrowth) -> dict[str, object]:
    return {"rank": w.rank, "workers": w.workers, "growing": w.growing,
            "median_growth_bytes": w.median_growth_bytes,
            "total_growth_bytes": w.total_growth_bytes,
            "median_rate_bytes_s": w.median_rate_bytes_s,
            "median_life_s": w.median_life_s}


def ops_data(o: RankOps) -> dict[str, Any]:
    """The verdict's ``ops`` entry of one rank: its roofs, MFU and top ops."""
    return {"rank": o.rank, "roofs": roofs_data(o.roofs) if o.roofs else None,
            "mfu": o.mfu, "mfu_dtype": o.mfu_dtype, "window_s": o.window_s,
            "note": o.note, "compiled_share": o.compiled_share,
            "top": o.top().to_dict(orient="records")}


def roofs_data(r: Roofs) -> dict[str, Any]:
    out: dict[str, Any] = {"flops": dict(r.flops), "bytes_s": r.bytes_s,
                           "source": r.source, "device": r.device}
    if r.published is not None:
        out["published"] = roofs_data(r.published)
        out["cross_check"] = r.cross_check()
    return out


def link_data(link: Link) -> dict[str, Any]:
    return {"name": link.name, "gb_per_s": link.shown_gb_per_s, "source": link.source,
            "across_nodes": link.across_nodes}


def comms_data(c: RankComms) -> dict[str, Any]:
    """The verdict's ``communication`` entry of one rank: its collectives by kind."""
    return {"rank": c.rank, "window_s": c.window_s,
            "link": link_data(c.link) if c.link else None,
            "exposed_by_bound_s": c.exposed_by_bound(),
            "by_kind": c.by_kind().to_dict(orient="records")}


def model_data(model: CommModel) -> dict[str, Any]:
    """The verdict's ``comm_model`` entry of one rank: the model and what it predicts."""
    m = model.model
    return {
        "rank": m.rank, "world": m.world, "step_s": m.step_s, "comm_s": m.comm_s,
        "exposed_s": m.exposed_s, "bytes_per_step": m.bytes_per_step,
        "buckets_per_step": m.calls_per_step, "bucket_cap_bytes": m.cap_bytes,
        "overlap_capacity_s": m.capacity_s, "backward_s": m.backward_s,
        "overlap_cores": m.overlap_cores,
        "alpha_s": m.link.alpha_s, "bus_gb_per_s": model.bus_gb_per_s,
        "fit": m.link.how, "link": link_data(model.link) if model.link else None,
        "what_if": [what_if_data(w) for w in model.what_ifs],
        "scaling": [scale_point_data(p) for p in model.scaling],
    }


def what_if_data(w: WhatIf) -> dict[str, Any]:
    return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(w).items()}


def scaling_data(s: KindScaling) -> dict[str, Any]:
    """The verdict's ``scaling``: the step at more ranks by the model of the job's kind."""
    return {"kind": s.kind, "note": s.note, "points": [scale_point_data(p) for p in s.points]}


def scale_point_data(p: ScalePoint) -> dict[str, Any]:
    return {"ranks": p.ranks, "step_s": round(p.step_s, 6), "exposed_s": round(p.exposed_s, 6),
            "exposed_share": p.shown_exposed_share, "across_nodes": p.across_nodes}


def _calls(slow: SlowSteps, group: CauseGroup) -> dict[str, Any]:
    """The calls the stack samples saw in a group's slow steps (doctor.analyse.spike_calls)."""
    calls = calls_of(slow.sites, group.steps)
    return calls.to_evidence() if calls is not None else {}


def slow_steps_data(slow: SlowSteps, most: int = 50) -> dict[str, Any]:
    """The verdict's ``slow_steps``: the groups by cause, then the slow steps (the longest
    ``most``) each with its cause."""
    longest = sorted(slow.steps, key=lambda s: -s.seconds)[:most]
    return {"groups": [{"cause": g.cause, "label": g.label, "machine": g.machine,
                        "steps": g.count, "over_median_s": round(g.over_s, 4),
                        "share_of_run": round(g.share, 4),
                        "share_of_steps": round(g.steps_share, 4),
                        "cause_s": round(g.lost_s, 4),
                        **_calls(slow, g)}
                       for g in slow.groups],
            "steps": [s.to_dict() for s in sorted(longest, key=lambda s: (s.rank, s.step))],
            "total": len(slow.steps)}
