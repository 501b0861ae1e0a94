"""The roofline chart of the HTML report: each costed op as a point (arithmetic intensity
against achieved FLOP/s, its size by its time), the machine's roofs as lines (the bandwidth's
slope up to each dtype's peak). Same conventions as doctor.reports.charts; None when no op has
a cost or no roofs are known."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from doctor.analyse.roofline import Roofs
from doctor.reports.charts import _chart_context, _tidy, _to_svg

BOUND_COLORS = {"compute": "#4e79a7", "memory": "#e15759", "launch": "#f28e2b"}
ROOF_STYLES = {"fp32": "-", "tf32": "--", "bf16": "-.", "fp16": ":", "fp8": ":", "fp64": "-"}


def roofline_chart(top: pd.DataFrame | None, roofs: Roofs | None) -> str | None:
    if top is None or top.empty or roofs is None or "intensity" not in top:
        return None
    points = top[(top["flops"] > 0) & (top["achieved_flops"] > 0) & top["intensity"].notna()]
    if points.empty:
        return None
    bw = float(roofs.bytes_s)
    peaks = {k: float(v) for k, v in roofs.flops.items() if v}
    lo = max(float(points["intensity"].min()) / 4, 1e-3)
    hi = max(float(points["intensity"].max()) * 4, max(peaks.values()) / bw * 4)
    with _chart_context("roofline"):
        fig = Figure(figsize=(7.2, 3.4), layout="constrained")
        ax = fig.add_subplot()
        xs = np.logspace(math.log10(lo), math.log10(hi), 200)
        for dtype, peak in sorted(peaks.items(), key=lambda kv: kv[1]):
            ax.plot(xs, np.minimum(peak, xs * bw), color="#777777", linewidth=1.0,
                    linestyle=ROOF_STYLES.get(dtype, "-"), label=f"roof {dtype}")
        sizes = 20 + 400 * points["share"].to_numpy(float) / max(float(points["share"].max()),
                                                                  1e-12)
        for bound, color in BOUND_COLORS.items():
            mine = points["bound"] == bound
            if mine.any():
                ax.scatter(points.loc[mine, "intensity"], points.loc[mine, "achieved_flops"],
                           s=sizes[mine.to_numpy()], color=color, alpha=0.7, label=f"{bound}-bound",
                           edgecolors="white", linewidths=0.5)
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):  # plain "1e+03" labels: the default's mathtext
            axis.set_major_formatter(FuncFormatter(_power_of_ten))  # ($10^{3}$) took most
            axis.set_minor_formatter(NullFormatter())  # of the report's time to parse
        ax.set_xlabel("arithmetic intensity (FLOP per byte)")
        ax.set_ylabel("achieved FLOP/s")
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
        _tidy(ax, "y")
        return _to_svg(fig, "roofline")


def _power_of_ten(value: float, _pos: int | None = None) -> str:
    """A log axis's major tick: "1e3", "1e-2", "1" (no mathtext)."""
    if value <= 0 or not math.isfinite(value):
        return ""
    exp = round(math.log10(value))
    return "1" if exp == 0 else f"1e{exp}"
