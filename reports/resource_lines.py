"""The terminal summary's one line per resource: each GPU as NVML saw it, each rank's memory,
and the lowest rank's ops (from the verdict's ``gpus``, ``memory`` and ``ops``)."""

from __future__ import annotations

from doctor.reports.text import format_share, format_value
from doctor.verdict import Verdict


def gpu_lines(verdict: Verdict, most: int = 4) -> list[str]:
    """One line per GPU the job ran on (from the verdict's ``gpus``), the first ``most``."""
    gpus = [g for g in verdict.extra.get("gpus") or [] if g.get("ranks")]
    lines = []
    for g in gpus[:most]:
        parts = [f"busy {format_share(g['util'])}"] if "util" in g else []
        if "memory_used_max_bytes" in g and "memory_total_bytes" in g:
            used = format_value("memory_bytes", g["memory_used_max_bytes"])
            total = format_value("memory_bytes", g["memory_total_bytes"])
            parts.append(f"memory {used} of {total} at peak")
        if g.get("clock_ratio", 1.0) < 0.95:
            parts.append(f"SM clock {format_share(g['clock_ratio'])} of max")
        name = f" ({g['name']})" if g.get("name") else ""
        ranks = ", ".join(str(r) for r in g["ranks"])
        lines.append(f"GPU {g['index']}{name}, rank{'s' if len(g['ranks']) > 1 else ''} "
                     f"{ranks}: " + ", ".join(parts))
    if len(gpus) > most:
        lines.append(f"(+{len(gpus) - most} more GPUs in the report)")
    return lines


def memory_lines(verdict: Verdict, most: int = 2) -> list[str]:
    """One line per rank (the first ``most``) from the verdict's ``memory``: its parts, and its
    peak against its capacity."""
    ranks = (verdict.extra.get("memory") or {}).get("ranks") or []
    lines = []
    for m in ranks[:most]:
        parts = [f"{name.replace('_', ' ')} {format_value('bytes', m[f'{name}_bytes'])}"
                 for name in ("parameters", "gradients", "optimizer_state", "activations")
                 if m.get(f"{name}_bytes")]
        if m.get("peak_bytes") and m.get("capacity_bytes"):
            parts.append(f"peak {format_value('bytes', m['peak_bytes'])} of "
                         f"{format_value('bytes', m['capacity_bytes'])}")
        if parts:
            lines.append(f"Memory, rank {m['rank']}: " + ", ".join(parts))
    if len(ranks) > most:
        lines.append(f"(+{len(ranks) - most} more ranks in the report)")
    return lines


def ops_lines(verdict: Verdict) -> list[str]:
    """One line for the lowest rank's ops (the verdict's ``ops``): their time by class, of the
    top ops, and the model FLOP utilisation."""
    ranks = verdict.extra.get("ops") or []
    if not ranks:
        return []
    first = ranks[0]
    by_bound: dict[str, float] = {}
    for row in first.get("top") or []:
        if row.get("bound"):
            by_bound[row["bound"]] = by_bound.get(row["bound"], 0.0) + float(row["share"] or 0)
    parts = []
    if by_bound:
        parts.append(", ".join(f"{bound}-bound {format_value('share', share)}" for bound, share
                               in sorted(by_bound.items(), key=lambda kv: -kv[1]))
                     + " of the op time")
    if first.get("mfu") is not None:
        parts.append(f"model FLOP utilisation {format_value('share', first['mfu'])} "
                     f"({first['mfu_dtype']})")
    return [f"Ops, rank {first['rank']}: " + "; ".join(parts)] if parts else []


def comm_lines(verdict: Verdict) -> list[str]:
    """One line for the critical rank's communication (the verdict's ``comm_model``, the rank
    with the most exposed): bytes a step, bus bandwidth against its link, the exposed share,
    and at 4x the ranks."""
    models = verdict.extra.get("comm_model") or []
    if not models:
        return []
    m = max(models, key=lambda m: m.get("exposed_s") or 0.0)
    calls = m["buckets_per_step"]
    parts = [f"{format_value('bytes', m['bytes_per_step'])} all-reduced a step in "
             f"{calls:.3g} bucket(s)"]
    link = m.get("link")
    if m.get("fit") == "latency":  # small calls: their time is the latency, not the bytes
        parts[0] += f", {format_value('time_s', m['alpha_s'])} each: latency-bound"
    else:
        parts[0] += f" at {m['bus_gb_per_s']:.3g} GB/s bus"
        if link and link.get("gb_per_s"):
            parts[0] += (f" ({format_share(m['bus_gb_per_s'] / link['gb_per_s'])} of "
                         f"{link['name']}'s {link['gb_per_s']:.3g} GB/s)")
    if m.get("step_s"):
        parts.append(f"exposed {format_share(m['exposed_s'] / m['step_s'])} of the step")
    points = m.get("scaling") or []
    far = [p for p in points if p["ranks"] >= 4 * m["world"]]
    if far:
        parts.append(f"at {far[0]['ranks']} ranks {format_share(far[0]['exposed_share'])}")
    return [f"Communication, rank {m['rank']}: " + "; ".join(parts)]
