"""The terminal summary's one line per resource: each GPU as NVML saw it, each rank's memory,
the lowest rank's ops and the critical rank's communication (from the analysis's sections,
doctor.analyse.analysis.Sections; the figures are worked out there, formatted here)."""

from __future__ import annotations

import math

from doctor.analyse.analysis import Sections
from doctor.analyse.comms import critical
from doctor.analyse.shard_phases import critical_phases
from doctor.reports.text import format_share, format_value


def gpu_lines(sections: Sections, most: int = 4) -> list[str]:
    """One line per GPU the job ran on (the sections' GPU counters), the first ``most``."""
    gpus = [g for g in (sections.counters.gpus if sections.counters else ()) if g.ranks]
    lines = []
    for g in gpus[:most]:
        parts = [f"busy {format_share(g.util)}"] if _known(g.util) else []
        if _known(g.mem_used_max_bytes) and _known(g.mem_total_bytes):
            used = format_value("memory_bytes", g.mem_used_max_bytes)
            total = format_value("memory_bytes", g.mem_total_bytes)
            parts.append(f"memory {used} of {total} at peak")
        if g.clock_ratio < 0.95:
            parts.append(f"SM clock {format_share(g.clock_ratio)} of max")
        name = f" ({g.name})" if g.name else ""
        ranks = ", ".join(str(r) for r in g.ranks)
        lines.append(f"GPU {g.index}{name}, rank{'s' if len(g.ranks) > 1 else ''} "
                     f"{ranks}: " + ", ".join(parts))
    if len(gpus) > most:
        lines.append(f"(+{len(gpus) - most} more GPUs in the report)")
    return lines


def memory_lines(sections: Sections, most: int = 2) -> list[str]:
    """One line per rank (the first ``most``) from the sections' memory: its parts, and its
    peak against its capacity."""
    ranks = list(sections.memory.ranks.values()) if sections.memory else []
    lines = []
    for m in ranks[:most]:
        parts = [f"{name.replace('_', ' ')} {format_value('bytes', m.parts.get(name))}"
                 for name in ("parameters", "gradients", "optimizer_state", "activations")
                 if m.parts.get(name)]
        if m.peak_bytes and m.capacity_bytes:
            parts.append(f"peak {format_value('bytes', m.peak_bytes)} of "
                         f"{format_value('bytes', m.capacity_bytes)}")
        if parts:
            lines.append(f"Memory, rank {m.rank}: " + ", ".join(parts))
    if len(ranks) > most:
        lines.append(f"(+{len(ranks) - most} more ranks in the report)")
    return lines


def ops_lines(sections: Sections) -> list[str]:
    """One line for the lowest rank's ops: their time by class, of the top ops, and the model
    FLOP utilisation."""
    first = sections.first_ops()
    if first is None:
        return []
    by_bound = first.top_by_bound()
    parts = []
    if by_bound:
        parts.append(", ".join(f"{bound}-bound {format_value('share', share)}"
                               for bound, share in by_bound.items()) + " of the op time")
    if first.mfu is not None:
        parts.append(f"model FLOP utilisation {format_value('share', first.mfu)} "
                     f"({first.mfu_dtype})")
    return [f"Ops, rank {first.rank}: " + "; ".join(parts)] if parts else []


def comm_lines(sections: Sections) -> list[str]:
    """One line for the critical rank's communication (doctor.analyse.comms.critical, the
    rank with the most exposed): bytes a step, bus bandwidth against its link, the exposed
    share, and at 4x the ranks."""
    model = critical(sections.models)
    if model is None:
        return scaling_lines(sections)
    m, link = model.model, model.link
    parts = [f"{format_value('bytes', m.bytes_per_step)} all-reduced a step in "
             f"{m.calls_per_step:.3g} bucket(s)"]
    if m.link.how == "latency":  # small calls: their time is the latency, not the bytes
        parts[0] += f", {format_value('time_s', m.link.alpha_s)} each: latency-bound"
    else:
        parts[0] += f" at {model.bus_gb_per_s:.3g} GB/s bus"
        if link is not None and model.of_link is not None:
            parts[0] += (f" ({format_share(model.of_link)} of "
                         f"{link.name}'s {link.shown_gb_per_s:.3g} GB/s)")
    if model.exposed_share is not None:
        parts.append(f"exposed {format_share(model.exposed_share)} of the step")
    far = model.far_point()
    if far is not None:
        parts.append(f"at {far.ranks} ranks {format_share(far.shown_exposed_share)}")
    return [f"Communication, rank {m.rank}: " + "; ".join(parts)]


def shard_lines(sections: Sections) -> list[str]:
    """One line for a sharded job's critical rank (doctor.analyse.shard_phases): each phase's
    time a step, its exposed part, bus bandwidth against the link, and whether prefetch
    worked."""
    phases = critical_phases(sections.shard_phases)
    if phases is None:
        return []
    parts = []
    for p in phases.phases:
        words = (f"{p.phase} {format_value('time_s', p.seconds)} "
                 f"({format_value('time_s', p.exposed_s)} exposed)")
        if _known(p.bus_gb_per_s):
            words += f" at {p.bus_gb_per_s:.3g} GB/s bus"
            if _known(p.of_link) and phases.link is not None:
                words += f" ({format_share(p.of_link)} of {phases.link.name})"
        if p.hook_s > p.seconds:
            words += f", FSDP's hooks around them {format_value('time_s', p.hook_s)}"
        if p.prefetch:
            words += f", prefetch {p.prefetch}"
        parts.append(words)
    return [f"Sharded collectives a step, rank {phases.rank}: " + "; ".join(parts)]


def scaling_lines(sections: Sections) -> list[str]:
    """One line for a sharded job's or a pipeline's scaling (doctor.analyse.kind_scaling):
    the exposed share now and at 4x the ranks, with its scaling efficiency."""
    scale = sections.scaling
    far = scale.far_point() if scale is not None else None
    if scale is None or far is None:
        return []
    base = scale.points[0]
    pipeline = scale.kind == "pipeline"
    unit, what = ("stages", "not computing") if pipeline else ("ranks", "exposed")
    return [f"Scaling ({scale.kind}): {what} {format_share(base.shown_exposed_share)} of the "
            f"step at {base.ranks} {unit}; at {far.ranks} {unit} with the same global batch "
            f"{format_share(far.shown_exposed_share)}, scaling efficiency "
            f"{format_share(far.efficiency(base))}"]


def _known(value: float) -> bool:
    return not math.isnan(value)
