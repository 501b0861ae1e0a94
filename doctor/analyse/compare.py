"""Two analyses side by side (``doctor compare``): step time, speedup, shares, settings."""

from __future__ import annotations

from typing import Any

from doctor.analyse.analysis import Analysis
from doctor.categories import CATEGORIES

#: Job facts worth putting side by side when they differ.
SETTINGS = ("device", "ranks", "cores", "torch_threads", "num_workers", "pin_memory",
            "batch_size")


def compare(a: Analysis, b: Analysis) -> dict[str, Any]:
    """B against A: ``speedup`` is A's median step over B's (above 1: B is faster)."""
    sides = {"a": _side(a), "b": _side(b)}
    ma, mb = sides["a"]["median_step_s"], sides["b"]["median_step_s"]
    cats = [c for c in (*CATEGORIES, "input")
            if c in a.verdict.shares or c in b.verdict.shares]
    shares = {c: {"a": float(a.verdict.shares.get(c, 0.0)),
                  "b": float(b.verdict.shares.get(c, 0.0))} for c in cats}
    for row in shares.values():
        row["delta"] = row["b"] - row["a"]
    settings = {}
    for key in SETTINGS:
        va, vb = sides["a"]["settings"].get(key), sides["b"]["settings"].get(key)
        if va != vb:
            settings[key] = (va, vb)
    return {**sides, "speedup": ma / mb if ma and mb else None, "shares": shares,
            "settings": settings}


def _side(analysis: Analysis) -> dict[str, Any]:
    v = analysis.verdict
    job = dict(v.job)
    loaders = analysis.tables.loaders
    if loaders is not None and not loaders.empty:
        first = loaders.iloc[0]
        for key in ("num_workers", "pin_memory", "batch_size"):
            if key in loaders:
                job[key] = first[key].item() if hasattr(first[key], "item") else first[key]
    return {"source": analysis.source, "bottleneck": v.bottleneck,
            "median_step_s": v.steps.get("median_s"), "steps": v.steps.get("analyzed"),
            "shares": dict(v.shares), "settings": {k: job.get(k) for k in SETTINGS}}
