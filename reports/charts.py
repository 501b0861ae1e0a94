"""Charts for the HTML report: matplotlib figures rendered to small SVG strings to inline.

Only the object-oriented API is used (``matplotlib.figure.Figure`` with the SVG canvas), so nothing
touches pyplot's global state or picks a GUI backend. Text stays text (``svg.fonttype: none``),
ids are deterministic (``svg.hashsalt``), and no user-controlled string (script name, arguments,
paths) ever goes into a chart: labels are category names, ``rank N`` and fixed words.

The functions return ``None`` when there is nothing to draw; the caller says so in words.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Literal

import matplotlib
import matplotlib.ticker
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_svg import FigureCanvasSVG
from matplotlib.figure import Figure

from doctor.analyse.ledger import StepMarks, step_marks
from doctor.analyse.phases import LABELS, PHASES
from doctor.analyse.whole_run import WholeRun
from doctor.reports.step_chart import (
    WIDTH,
    ledger_envelope,
    phase_marks,
    spike_marks,
    thousands,
    whole_envelope,
)

#: Order of the categories in charts and tables: input-side first, then the device side.
#: ``input`` (input wait that a trace alone cannot split) sits with the input categories.
CHART_ORDER: tuple[str, ...] = (
    "io", "decode", "preprocess", "input", "transfer", "compute", "communication", "other",
)

#: One colour per category (Tableau 10), shared by both charts and the HTML legend.
CATEGORY_COLORS: dict[str, str] = {
    "io": "#b07aa1",
    "decode": "#e15759",
    "preprocess": "#f28e2b",
    "input": "#edc948",
    "transfer": "#76b7b2",
    "compute": "#4e79a7",
    "communication": "#59a14f",
    "other": "#bab0ac",
}
_RANK_COLORS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
                "#ff9da7", "#9c755f", "#bab0ac")

#: Most points drawn per rank; longer ledgers are folded into this many buckets.
MAX_POINTS = WIDTH
#: Ranks named in the legend; beyond this the lines stay unlabelled.
MAX_LEGEND_RANKS = 8

#: The legend's names of the steps the step chart marks, in legend order.
WARMUP_LABEL = "warm-up"
WINDOW_LABEL = "deep window (profiled)"
SAMPLING_LABEL = "stack sampling"
SLOWEST_LABEL = "slowest step of each bucket"
RANGE_LABEL = "shortest to mean step"
ANALYSED_LABEL = "steps analysed (the newest)"
SLOW_LABEL, STALL_LABEL = "slow step", "long stall"
_PHASE_COLORS = {LABELS[k]: c for k, c in zip(PHASES, ("#2ca02c", "#8c564b", "#17becf", "#bcbd22"),
                                              strict=True)}
_MARK_LABELS = (WARMUP_LABEL, WINDOW_LABEL, SAMPLING_LABEL, *_PHASE_COLORS, SLOW_LABEL,
                STALL_LABEL, ANALYSED_LABEL)
_WINDOW_COLOR = "#5b2a86"
_SAMPLING_COLOR = "#e8a33d"

# Keys typed Any: matplotlib types rc keys as a Literal of every known name.
_RC: dict[Any, Any] = {
    "svg.fonttype": "none",
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans", "Helvetica", "Arial"],
    "font.size": 9.0,
    "axes.edgecolor": "#888888",
    "axes.labelcolor": "#333333",
    "xtick.color": "#555555",
    "ytick.color": "#555555",
    "path.simplify": True,
}


def ordered_categories(keys: Sequence[str] | Mapping[str, object]) -> list[str]:
    """The categories among ``keys`` in chart order, unknown ones last (sorted)."""
    present = list(keys)
    known = [c for c in CHART_ORDER if c in present]
    return known + sorted(k for k in present if k not in CHART_ORDER)


def color_of(category: str) -> str:
    return CATEGORY_COLORS.get(category, "#999999")


def shares_chart(shares: Mapping[str, float], bottleneck: str = "") -> str | None:
    """Horizontal bars, one per category, labelled with its share of step time.

    Returns None when there are no shares to show (all zero or missing).
    """
    cats = ordered_categories(shares)
    values = [_finite(shares.get(c)) for c in cats]
    if not cats or sum(values) <= 0:
        return None
    with _chart_context("shares"):
        fig = Figure(figsize=(4.8, 0.26 * len(cats) + 0.65), layout="constrained")
        ax = fig.add_subplot()
        y = np.arange(len(cats))[::-1]
        colors = [color_of(c) for c in cats]
        bars = ax.barh(y, values, color=colors, height=0.68)
        for bar, cat in zip(bars, cats, strict=True):
            if bottleneck and cat != bottleneck:
                bar.set_alpha(0.75)
        top = max(values)
        for yi, value, cat in zip(y, values, cats, strict=True):
            weight = "bold" if cat == bottleneck else "normal"
            pct = value * 100
            ax.text(value + top * 0.01, yi, f"{pct:.0f}%" if pct >= 10 else f"{pct:.1f}%",
                    va="center", ha="left", fontsize=8.5, color="#222222", fontweight=weight)
        ax.set_yticks(y, labels=cats)
        for label in ax.get_yticklabels():
            if label.get_text() == bottleneck:
                label.set_fontweight("bold")
        ax.set_xlim(0, max(top * 1.15, 0.05))
        ax.xaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(xmax=1.0, decimals=0))
        ax.set_xlabel("share of analysed step time")
        _tidy(ax, "x")
        return _to_svg(fig, "shares")


def step_time_chart(ledger: pd.DataFrame, whole: WholeRun | None = None) -> str | None:
    """Step time over the whole run; warm-up steps, the deep window, stack sampling, the
    phases (evaluation, checkpoints, epoch starts) and the slow steps marked.

    One rank: the step stacked by category (falls back to wall time when the ledger has no
    per-category split), with the longest step of each bucket drawn over it. Several ranks: one
    line of wall time per rank. Long ledgers are folded into buckets (reports.step_chart: each
    keeps its shortest, median and longest step, so a single spike survives); the marks are
    placed by step number. Where the ledger holds only the newest steps of a long run, ``whole``
    (the run's step buckets) draws all of them. Returns None for an empty ledger.
    """
    if ledger is None or ledger.empty or "wall_s" not in ledger or "step" not in ledger:
        return None
    frame = ledger.dropna(subset=["step", "wall_s"])
    if frame.empty:
        return None
    frame = frame.sort_values(["rank", "step"] if "rank" in frame else ["step"])
    ranks = sorted(frame["rank"].dropna().unique()) if "rank" in frame else [0]
    if whole is not None and whole.partial() and int(ranks[0]) in whole.ranks:
        return _whole_run_chart(frame, whole, int(ranks[0]))
    warm = _bool_column(frame, "warmup")
    marks = step_marks(frame)
    scale, unit = _time_unit(frame.loc[~warm, "wall_s"] if (~warm).any() else frame["wall_s"])
    cats = [c for c in ordered_categories([c for c in frame.columns if c in CHART_ORDER])
            if _finite(frame[c].fillna(0).abs().sum()) > 0]
    stacked = len(ranks) == 1 and bool(cats) and _split_covers_wall(frame, cats)

    with _chart_context("steps"):
        fig = Figure(figsize=(7.2, 2.9), layout="constrained")
        ax = fig.add_subplot()
        if stacked:
            env = ledger_envelope(frame, cats)
            ax.stackplot(env.step, *[env.means[c] * scale for c in cats], labels=cats,
                         colors=[color_of(c) for c in cats], linewidth=0)
            if env.folded:
                [line] = ax.plot(env.step, env.high * scale, linewidth=0.7, color="#333333",
                                 label=SLOWEST_LABEL)
                line.set_gid("steps-slowest")
        else:
            for i, rank in enumerate(ranks):
                rows = frame[frame["rank"] == rank] if "rank" in frame else frame
                env = ledger_envelope(rows, [])
                label = f"rank {int(rank)}" if len(ranks) <= MAX_LEGEND_RANKS else None
                if len(ranks) == 1:
                    label = "wall time"
                color = _RANK_COLORS[i % len(_RANK_COLORS)]
                ax.plot(env.step, env.mid * scale, linewidth=1.1, color=color, label=label)
                if env.folded:
                    ax.plot(env.step, env.high * scale, linewidth=0.6, color=color, alpha=0.6)
        _mark_steps(ax, marks)
        rows = frame[frame["rank"] == ranks[0]] if "rank" in frame else frame
        _mark_phases_and_spikes(ax, rows, whole, int(ranks[0]), 0)
        _legend(ax, stacked)
        _clip_outliers(ax, frame, warm, scale, stacked)
        ax.set_xlabel("step")
        ax.set_ylabel(f"step time ({unit})")
        ax.set_ylim(bottom=0)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        _tidy(ax, "y")
        return _to_svg(fig, "steps")


def _whole_run_chart(frame: pd.DataFrame, whole: WholeRun, rank: int) -> str | None:
    """The whole run of ``rank`` from its step buckets: the band from the shortest to the
    longest step of each bucket, the mean step, and the marks (phases and slow steps of the
    ledger's newest steps, placed after the steps it lost; the long stalls among those)."""
    env = whole_envelope(whole, rank)
    if env is None:
        return None
    rows = frame[frame["rank"] == rank] if "rank" in frame else frame
    offset = whole.lost(rank)
    scale, unit = _time_unit(pd.Series(env.mid))
    with _chart_context("steps"):
        fig = Figure(figsize=(7.2, 2.9), layout="constrained")
        ax = fig.add_subplot()
        band = ax.fill_between(env.step, env.low * scale, env.mid * scale, color="#4e79a7",
                               alpha=0.25, linewidth=0, label=RANGE_LABEL)
        band.set_gid("steps-range")
        ax.plot(env.step, env.mid * scale, linewidth=1.0, color="#4e79a7", label="mean step")
        [line] = ax.plot(env.step, env.high * scale, linewidth=0.6, color="#333333",
                         label=SLOWEST_LABEL)
        line.set_gid("steps-slowest")
        span = ax.axvspan(offset + 0.5, float(env.step[-1]) + 1, facecolor="#888888",
                          alpha=0.08, linewidth=0, label=ANALYSED_LABEL)
        span.set_gid("steps-analysed")
        _mark_phases_and_spikes(ax, rows, whole, rank, offset)
        _legend(ax, False)
        limit = _finite(np.quantile(env.mid, 0.99)) * 3
        if limit > 0 and _finite(env.high.max()) > limit * 1.5:
            ax.set_ylim(0, limit * scale)
            ax.text(1.0, 1.0, "slower steps clipped ", transform=ax.transAxes, va="top",
                    ha="right", fontsize=7.5, color="#555555")
        else:
            ax.set_ylim(bottom=0)
        ax.set_xlabel(f"step (the whole run: {whole.ranks[rank].total:,} steps)")
        ax.set_ylabel(f"step time ({unit})")
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(thousands))
        _tidy(ax, "y")
        return _to_svg(fig, "steps")


def _mark_phases_and_spikes(ax: Axes, rows: pd.DataFrame, whole: WholeRun | None, rank: int,
                            offset: int) -> None:
    """Ticks along the bottom for each phase's steps, and triangles along the top for the slow
    steps and long stalls (above whatever the y limits clip), each an SVG group of its own
    (``steps-phase-evaluation``, ``steps-slow-step``, ``steps-long-stall``, ...)."""
    phases = phase_marks(rows, whole, rank, offset).at
    for label, at in phases.items():
        [ticks] = ax.plot(at, np.full(len(at), 0.02), linestyle="none", marker="|",
                          markersize=9, markeredgewidth=1.2, color=_PHASE_COLORS.get(label,
                                                                                    "#444444"),
                          transform=ax.get_xaxis_transform(), clip_on=False, label=label,
                          zorder=5)
        ticks.set_gid(f"steps-phase-{label.replace(' ', '-')}")
    for label, at in spike_marks(rows, whole, rank, offset).at.items():
        [tri] = ax.plot(at, np.full(len(at), 0.95), linestyle="none", marker="v",
                        markersize=5 if label == SLOW_LABEL else 7,
                        color="#d62728" if label != SLOW_LABEL else "#ff9da7",
                        transform=ax.get_xaxis_transform(), clip_on=False, label=label,
                        zorder=5)
        tri.set_gid(f"steps-{label.replace(' ', '-')}")


# --- helpers ---------------------------------------------------------------------------------


@contextmanager
def _chart_context(name: str) -> Iterator[None]:
    """rcParams for one chart, restored afterwards (the hash salt keeps ids unique per chart)."""
    with matplotlib.rc_context({**_RC, "svg.hashsalt": f"doctor-{name}"}):
        yield


_METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.DOTALL)


def _to_svg(fig: Figure, name: str) -> str:
    """The figure as an inline ``<svg>`` element: no XML prolog, DOCTYPE or RDF metadata."""
    FigureCanvasSVG(fig)
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None},
                facecolor="white")
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    text = _METADATA.sub("", text)
    return text.replace("<svg ", f'<svg class="chart chart-{name}" role="img" ', 1).strip()


def _tidy(ax: Axes, grid: Literal["x", "y"]) -> None:
    ax.spines["top"].set_visible(False)
    ax.spines["right"].set_visible(False)
    ax.grid(axis=grid, color="#e4e4e4", linewidth=0.6)
    ax.set_axisbelow(True)


def is_decimated(ledger: pd.DataFrame) -> bool:
    """Whether step_time_chart folds this ledger into buckets (some rank has too many steps)."""
    if ledger is None or ledger.empty or "step" not in ledger:
        return False
    per_rank = ledger.groupby("rank").size() if "rank" in ledger else pd.Series([len(ledger)])
    return bool(per_rank.max() > MAX_POINTS)


def _finite(value: object) -> float:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0
    return number if math.isfinite(number) else 0.0


def _bool_column(frame: pd.DataFrame, name: str) -> pd.Series:
    if name not in frame:
        return pd.Series(False, index=frame.index)
    return frame[name].fillna(False).astype(bool)


def _time_unit(wall: pd.Series) -> tuple[float, str]:
    median = _finite(wall.median()) if len(wall) else 0.0
    if median >= 1.0:
        return 1.0, "s"
    if median >= 1e-3 or median == 0.0:
        return 1e3, "ms"
    return 1e6, "µs"


def _split_covers_wall(frame: pd.DataFrame, cats: list[str]) -> bool:
    """Whether the per-category columns add up to (most of) the wall time."""
    total = _finite(frame["wall_s"].sum())
    split = _finite(frame[cats].fillna(0).sum(axis=1).sum())
    return total > 0 and split >= 0.5 * total


def _mark_steps(ax: Axes, marks: StepMarks) -> None:
    """Hatch the warm-up and the deep window, and bar the stack-sampling span along the top
    (a bar stays visible above a stacked chart and whatever the y limits clip). Each mark is
    an SVG group with its own id (``steps-warmup``, ``steps-deep-window``,
    ``steps-stack-sampling``)."""
    if marks.warmup is not None:
        first, last = marks.warmup
        span = ax.axvspan(first - 0.5, last + 0.5, facecolor="none", edgecolor="#555555",
                          hatch="////", linewidth=0, alpha=0.45, label=WARMUP_LABEL, zorder=3)
        span.set_gid("steps-warmup")
    if marks.window is not None:
        first, last = marks.window
        span = ax.axvspan(first - 0.5, last + 0.5, facecolor="none", edgecolor=_WINDOW_COLOR,
                          hatch="xxx", linewidth=0, alpha=0.75, label=WINDOW_LABEL, zorder=3)
        span.set_gid("steps-deep-window")
    if marks.sampling is not None:
        first, last = marks.sampling
        [bar] = ax.plot([first - 0.5, last + 0.5], [0.985, 0.985],
                        transform=ax.get_xaxis_transform(), color=_SAMPLING_COLOR, linewidth=4,
                        solid_capstyle="butt", clip_on=False, label=SAMPLING_LABEL, zorder=4)
        bar.set_gid("steps-stack-sampling")


def _legend(ax: Axes, stacked: bool) -> None:
    """The series (a stack's categories top first) and then the marks, in MARK order."""
    handles, labels = ax.get_legend_handles_labels()
    series = [(h, text) for h, text in zip(handles, labels, strict=True)
              if text not in _MARK_LABELS]
    if stacked:
        series.reverse()
    marks = sorted(((h, text) for h, text in zip(handles, labels, strict=True)
                    if text in _MARK_LABELS), key=lambda pair: _MARK_LABELS.index(pair[1]))
    pairs = series + marks
    if pairs:
        ax.legend([h for h, _ in pairs], [text for _, text in pairs], loc="upper left",
                  bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)


def _clip_outliers(ax: Axes, frame: pd.DataFrame, warm: pd.Series, scale: float,
                   stacked: bool) -> None:
    """Keep steady steps readable when warm-up (compilation, lazy imports) is far slower."""
    steady = frame.loc[~warm, "wall_s"]
    if steady.empty:
        return
    limit = _finite(steady.quantile(0.99)) * 1.6
    peak = _finite(frame["wall_s"].max())
    if limit > 0 and peak > limit * 1.5:
        ax.set_ylim(0, limit * scale)
        ax.text(1.0, 1.0, "slower steps clipped ", transform=ax.transAxes, va="top",
                ha="right", fontsize=7.5, color="#555555")


__all__ = [
    "CATEGORY_COLORS",
    "CHART_ORDER",
    "SAMPLING_LABEL",
    "WARMUP_LABEL",
    "WINDOW_LABEL",
    "color_of",
    "is_decimated",
    "ordered_categories",
    "shares_chart",
    "step_time_chart",
]
