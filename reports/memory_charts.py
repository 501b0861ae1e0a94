"""The memory charts of the HTML report, from the analysis's memory tables: each rank's
breakdown as one bar against its capacity, and memory over the run against the capacity line.
Same conventions as doctor.reports.charts (object-oriented matplotlib, inline SVG, no string
from the job in a chart); None when there is nothing to draw."""

from __future__ import annotations

import math

import pandas as pd
from matplotlib.figure import Figure

from doctor.reports.charts import _chart_context, _tidy, _to_svg

#: The parts of a bar, in order, and their colours; what is left of the capacity is "free".
PARTS: tuple[tuple[str, str, str], ...] = (
    ("parameters_bytes", "parameters", "#4e79a7"),
    ("gradients_bytes", "gradients", "#76b7b2"),
    ("optimizer_state_bytes", "optimizer state", "#f28e2b"),
    ("activations_bytes", "activations", "#e15759"),
    ("between_steps_bytes", "kept between steps (model state, buffers)", "#9c755f"),
    ("other_bytes", "rest of the peak (allocator cache, buffers, libraries)", "#bab0ac"),
)
FREE_COLOR = "#eeeeee"
#: The capacity is drawn when the peak reaches this share of it; below, the parts would be
#: slivers beside it (the caption gives the capacity in words).
SHOW_CAPACITY_FROM = 0.2
MAX_RANKS = 16
_RANK_COLORS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948")


def _gib(value: object) -> float:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0
    return number / 2**30 if math.isfinite(number) else 0.0


def shows_capacity(table: pd.DataFrame) -> bool:
    """Whether the charts draw the capacity: some rank's peak is SHOW_CAPACITY_FROM of it."""
    if "capacity_bytes" not in table or "peak_bytes" not in table:
        return False
    share = table["peak_bytes"] / table["capacity_bytes"]
    return bool((share >= SHOW_CAPACITY_FROM).any())


def breakdown_chart(table: pd.DataFrame | None) -> str | None:
    """One horizontal bar per rank: its parts, what else its peak holds, and the capacity."""
    if table is None or table.empty:
        return None
    rows = table.head(MAX_RANKS).iloc[::-1]  # rank 0 at the top
    with _chart_context("memory"):
        fig = Figure(figsize=(7.2, 0.6 + 0.35 * len(rows)), layout="constrained")
        ax = fig.add_subplot()
        labels = [f"rank {int(r)}" for r in rows["rank"]]
        left = [0.0] * len(rows)
        for column, label, color in PARTS:
            if column == "other_bytes":
                parts = [sum(_gib(row.get(c)) for c, _, _ in PARTS[:-1]) for _, row in
                         rows.iterrows()]
                values = [max(_gib(row.get("peak_bytes")) - p, 0.0)
                          for p, (_, row) in zip(parts, rows.iterrows(), strict=True)]
            elif column in rows:
                values = [_gib(v) for v in rows[column]]
            else:
                continue
            if not any(values):
                continue
            ax.barh(labels, values, left=left, color=color, label=label, height=0.6)
            left = [a + b for a, b in zip(left, values, strict=True)]
        if "capacity_bytes" in rows and shows_capacity(table):
            free = [max(_gib(c) - used, 0.0) for c, used in
                    zip(rows["capacity_bytes"], left, strict=True)]
            if any(free):
                ax.barh(labels, free, left=left, color=FREE_COLOR, label="free",
                        height=0.6, edgecolor="#cccccc", linewidth=0.5)
        ax.set_xlabel("GiB")
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
        _tidy(ax, "x")
        return _to_svg(fig, "memory")


def over_run_chart(over: pd.DataFrame | None) -> str | None:
    """Each rank's memory over the run (used; reserved dashed, on a GPU) and its capacity."""
    if over is None or over.empty:
        return None
    with _chart_context("memory-over-run"):
        fig = Figure(figsize=(7.2, 2.6), layout="constrained")
        ax = fig.add_subplot()
        ranks = sorted(over["rank"].unique())[:len(_RANK_COLORS)]
        for i, rank in enumerate(ranks):
            rows = over[over["rank"] == rank].sort_values("t_s")
            color = _RANK_COLORS[i]
            ax.plot(rows["t_s"], [_gib(v) for v in rows["used_bytes"]], color=color,
                    linewidth=1.2, label=f"rank {int(rank)} used")
            if rows["reserved_bytes"].notna().any():
                ax.plot(rows["t_s"], [_gib(v) for v in rows["reserved_bytes"]], color=color,
                        linewidth=1.0, linestyle="--", label=f"rank {int(rank)} reserved")
        capacity = over["capacity_bytes"].dropna()
        if len(capacity) and over["used_bytes"].max() >= SHOW_CAPACITY_FROM * capacity.max():
            ax.axhline(_gib(capacity.max()), color="#c0392b", linewidth=1.0, linestyle=":",
                       label="capacity")
        ax.set_xlabel("seconds from the run's start")
        ax.set_ylabel("GiB")
        ax.set_ylim(bottom=0)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
        _tidy(ax, "y")
        return _to_svg(fig, "memory-over-run")
