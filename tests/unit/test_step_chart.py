"""The step chart marks the steps the shares leave out: warm-up, the deep window, stack sampling.

The marks are found in the SVG by their group ids and legend texts; where they sit is read from
their paths, which map step numbers linearly onto the x axis."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from doctor.analyse.analysis import Analysis
from doctor.analyse.ledger import StepMarks, step_marks
from doctor.reports import charts
from doctor.reports.html import render_html
from doctor.verdict import CATEGORIES, Verdict

WEIGHTS = {"io": 0.01, "decode": 0.83, "preprocess": 0.05, "transfer": 0.0,
           "compute": 0.08, "communication": 0.0, "other": 0.03}


def ledger(steps: int, ranks: int = 1, warmup: int = 5,
           window: tuple[int, int] | None = (8, 12), sampled: tuple[int, int] | None = (8, 30),
           shift: int = 0) -> pd.DataFrame:
    """A ledger with steps numbered from 1; rank r's window and sampling start ``r * shift``
    steps later."""
    rng = np.random.default_rng(3)
    frames = []
    for rank in range(ranks):
        step = np.arange(1, steps + 1)
        wall = 0.09 + 0.01 * rng.random(steps)
        wall[:warmup] *= 4
        data: dict[str, object] = {"rank": np.full(steps, rank), "step": step,
                                   "start_s": np.cumsum(wall) - wall, "wall_s": wall}
        for cat in CATEGORIES:
            data[cat] = wall * WEIGHTS[cat]
        flags = {"warmup": step <= warmup}
        for flag, span in (("in_window", window), ("sampled", sampled)):
            first, last = span if span else (0, -1)
            flags[flag] = (step >= first + rank * shift) & (step <= last + rank * shift)
        flags["window_close"] = step == (window[1] + rank * shift if window else -1)
        flags["analyzed"] = ~(flags["warmup"] | flags["in_window"])
        data.update(flags)
        frames.append(pd.DataFrame(data))
    return pd.concat(frames, ignore_index=True)


def mark_xs(svg: str, gid: str) -> list[float]:
    """The x coordinates of the path inside the SVG group ``gid``."""
    group = re.search(rf'<g id="{gid}">\s*<path d="([^"]+)"', svg)
    assert group is not None, f"no {gid} in the chart"
    return [float(x) for x in re.findall(r"[ML] ([-\d.]+) [-\d.]+", group.group(1))]


def test_the_window_and_the_sampling_span_are_marked_with_their_legend() -> None:
    svg = charts.step_time_chart(ledger(80))
    assert svg is not None
    for text in ("warm-up", "deep window (profiled)", "stack sampling"):
        assert f">{text}<" in svg
    for gid in ("steps-warmup", "steps-deep-window", "steps-stack-sampling"):
        assert f'id="{gid}"' in svg
    assert svg.count("<pattern") == 2  # two hatches: warm-up and the deep window


def test_a_ledger_without_window_or_sampling_has_no_marks_for_them() -> None:
    for frame in (ledger(80, window=None, sampled=None),
                  ledger(80).drop(columns=["in_window", "sampled", "window_close"])):
        svg = charts.step_time_chart(frame)
        assert svg is not None
        assert ">warm-up<" in svg and 'id="steps-warmup"' in svg
        assert "deep window" not in svg and "stack sampling" not in svg
        assert 'id="steps-deep-window"' not in svg and 'id="steps-stack-sampling"' not in svg
        assert svg.count("<pattern") == 1
        assert step_marks(frame) == StepMarks(warmup=(1, 5))


def test_marks_stay_on_their_steps_when_steps_are_averaged_in_buckets() -> None:
    frame = ledger(20_000, window=(5_000, 5_399), sampled=(5_000, 5_999))
    assert charts.is_decimated(frame)
    assert step_marks(frame) == StepMarks((1, 5), (5_000, 5_399), (5_000, 5_999))
    svg = charts.step_time_chart(frame)
    assert svg is not None
    window, bar = mark_xs(svg, "steps-deep-window"), mark_xs(svg, "steps-stack-sampling")
    x0, x1 = min(window), max(window)
    assert min(bar) == x0  # both start at step 5000
    # 1000 sampled steps against 400 in the window: the x axis counts steps, not buckets
    assert (max(bar) - x0) / (x1 - x0) == pytest.approx(1000 / 400, rel=0.01)


def test_several_ranks_mark_the_span_that_covers_every_rank() -> None:
    frame = ledger(60, ranks=4, shift=1)  # rank r's window: steps 8+r .. 12+r
    assert step_marks(frame) == StepMarks((1, 5), (8, 15), (8, 33))
    svg = charts.step_time_chart(frame)
    assert svg is not None
    assert ">rank 3<" in svg and ">deep window (profiled)<" in svg and ">stack sampling<" in svg
    window, warm = mark_xs(svg, "steps-deep-window"), mark_xs(svg, "steps-warmup")
    per_step = (max(warm) - min(warm)) / 5  # warm-up: steps 1..5
    assert (max(window) - min(window)) / per_step == pytest.approx(8, rel=0.01)


def test_the_caption_says_what_the_marks_mean() -> None:
    verdict = Verdict(bottleneck="decode", shares=dict(WEIGHTS),
                      steps={"count": 80, "analyzed": 70, "median_s": 0.095}, findings=[],
                      probes={}, job={"argv": ["python", "train.py"], "exit_code": 0,
                                      "ranks": 2, "device": "cpu"})
    html = render_html(Analysis(verdict, ledger(80, ranks=2), "doctor-runs/x"))
    caption = re.search(r'<section id="steps">.*?<figcaption>(.*?)</figcaption>', html,
                        flags=re.DOTALL)
    assert caption is not None
    words = " ".join(caption.group(1).split())
    assert "hatched steps at the start are warm-up" in words
    marks = step_marks(ledger(80, ranks=2))
    assert marks.window is not None and marks.sampling is not None
    assert (f"cross-hatched steps {marks.window[0]}-{marks.window[1]} are the deep window"
            in words)
    assert (f"bar along the top spans steps {marks.sampling[0]}-{marks.sampling[1]}, under "
            "stack sampling" in words)
    assert "Each mark spans every rank's steps" in words
    quiet = ledger(80, ranks=1).assign(in_window=False, sampled=False)
    html = render_html(Analysis(verdict, quiet, "doctor-runs/x"))
    assert "cross-hatched" not in html and "bar along the top" not in html
