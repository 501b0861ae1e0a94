"""The HTML reports in a real browser: headless Chromium (tests/browser.py) renders the report of
one sample run, of a recorded GPU trace, of a ``doctor try`` and of a ``doctor compare``, and
checks what a reader would see: the headline and every section, a page that loads nothing and
logs no error under its own Content-Security-Policy, nothing wider than the window outside a
scroll container, and a printout with no table cut at the edge of the paper.

The tests skip, saying why, only where no Chromium can be found or started (install Debian's
``chromium``, or point DOCTOR_CHROMIUM at one)."""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from tests.browser import CANDIDATES, Browser, BrowserUnavailable, Page, find_chromium
from tests.support import SAMPLE_JOBS, SHARED_TRACES, doctor_cmd

#: A DDP trace of real GPUs: it brings the ops and communication sections and the widest tables.
GPU_TRACE = SHARED_TRACES / "ddp_a100_rank0_of_2_hostbound.json.gz"

WINDOW_PX = 1280
#: The width that Chrome lays a page out at when it prints on A4 with its default 1 cm margins
#: (210 mm less 20 mm, at 96 CSS px to the inch); Letter paper is wider.
PRINT_PX = 718

#: Sections that each kind of report has whatever the job did (the template adds more).
ALWAYS = {
    "run": {"shares", "steps", "findings", "probes", "tables", "job"},
    "trace": {"shares", "steps", "ops", "findings", "probes", "tables", "job"},
    "try": {"results", "job"},
    "compare": {"shares", "job"},
}


@dataclass(frozen=True)
class Report:
    """One rendered report file and what its own markup says it holds."""

    kind: str
    path: Path
    headline: str
    sections: dict[str, str]  # section id -> its h2's text


class _Outline(HTMLParser):
    """The h1 and the h2 of each ``<section id=...>`` in an HTML document, as written."""

    def __init__(self) -> None:
        super().__init__()
        self.h1 = ""
        self.sections: dict[str, str] = {}
        self._section = ""
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "section":
            self._section = dict(attrs).get("id") or ""
            self.sections[self._section] = ""
        elif tag in ("h1", "h2"):
            self._in = tag

    def handle_endtag(self, tag: str) -> None:
        if tag == self._in:
            self._in = None

    def handle_data(self, data: str) -> None:
        if self._in == "h1":
            self.h1 += data
        elif self._in == "h2" and self._section:
            self.sections[self._section] += data


def outline(kind: str, path: Path) -> Report:
    parser = _Outline()
    parser.feed(path.read_text(encoding="utf-8"))
    return Report(kind, path, " ".join(parser.h1.split()),
                  {k: " ".join(v.split()) for k, v in parser.sections.items()})


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    path = find_chromium()
    if path is None:
        looked = (f"DOCTOR_CHROMIUM={os.environ['DOCTOR_CHROMIUM']}"
                  if os.environ.get("DOCTOR_CHROMIUM") else ", ".join(CANDIDATES) + " on PATH")
        pytest.skip(f"no Chromium here (looked for {looked}): install Debian's chromium "
                    "(apt-get install chromium) to run the browser tests")
    try:
        started = Browser(path)
    except BrowserUnavailable as err:
        pytest.skip(f"Chromium could not be started: {err}")
    with started:
        yield started


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real ``doctor run`` of the input-bound sample job, shared by the tests here."""
    out = tmp_path_factory.mktemp("browser") / "run"
    result = doctor_cmd("run", "--out", str(out), "--", sys.executable,
                        str(SAMPLE_JOBS / "input_bound.py"), "--steps", "30")
    assert result.returncode == 0, result.stderr
    return out


def _trace_report(tmp: Path) -> Path:
    if not GPU_TRACE.is_file():
        pytest.skip(f"the recorded traces are not here ({SHARED_TRACES})")
    out = tmp / "trace.html"
    result = doctor_cmd("report", str(GPU_TRACE), "--format", "html", "-o", str(out))
    assert result.returncode == 0, result.stderr
    return out


def _try_report(tmp: Path) -> Path:
    """A ``doctor try`` record as the runner writes it, rendered by the try report (running the
    job again and again for it would cost a minute)."""
    from doctor.reports.tries import render_try_html
    from doctor.store.try_record import TryRecord

    long_path = "/home/someone/projects/a-rather-long-project-name/experiments/2024-06/train.py"
    record: dict[str, Any] = {
        "run": "doctor-runs/20240601-120000-train", "dir": "doctor-runs/x/tries/1",
        "command": ["python", long_path, "--data", "/mnt/datasets/" + "imagenet-" * 12,
                    "--lr", "0.1"],
        "cwd": "/home/someone/projects/a-rather-long-project-name",
        "env_notes": ["PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True was set by the job"],
        "steps": 30, "steps_per_attempt": 15, "stop_at_step": 20, "repeat": 2,
        "best": "input.loader:1", "unsteady": "",
        "baseline": {"median_step_s": 0.0217},
        "candidates": [
            {"id": "input.loader:1", "label": "num_workers=4, persistent_workers=True, "
             "prefetch_factor=4", "estimate": 2.9, "speedup": 2.41, "low": 2.3, "high": 2.5,
             "ratio": 0.83, "median_step_s": 0.009, "outcome": "faster", "why": "",
             "errors": [], "stderr_tail": ""},
            {"id": "transfer.pinned:1", "label": "pin_memory=True", "estimate": None,
             "speedup": None, "low": None, "high": None, "ratio": None, "median_step_s": None,
             "outcome": "failed", "why": "the job exited with status 1",
             "errors": ["RuntimeError: " + "x" * 160],
             "stderr_tail": "Traceback (most recent call last):\n  File \"" + long_path
             + "\", line 12, in <module>\n    main()\nRuntimeError: " + "y" * 200 + "\n"},
        ],
        "manual": [{"id": "input.preprocess", "title": "Augment whole batches on the GPU"}],
        "cost": {"wall_s": 41.0, "attempts": 6},
    }
    out = tmp / "try.html"
    out.write_text(render_try_html(TryRecord.from_dict(record)), encoding="utf-8")
    return out


def _compare_report(tmp: Path, run: Path) -> Path:
    out = tmp / "compare.html"
    result = doctor_cmd("compare", str(run), str(run), "--format", "html", "-o", str(out))
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="module", params=[pytest.param("run", marks=pytest.mark.e2e), "trace",
                                        "try", pytest.param("compare", marks=pytest.mark.e2e)])
def shown(request: pytest.FixtureRequest, browser: Browser,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Report, Page]]:
    """Each report, rendered in its own tab of the module's browser, 1280 px wide."""
    kind = request.param
    tmp = tmp_path_factory.mktemp(kind)
    if kind == "run":
        path = request.getfixturevalue("run_dir") / "report.html"
    elif kind == "trace":
        path = _trace_report(tmp)
    elif kind == "try":
        path = _try_report(tmp)
    else:
        path = _compare_report(tmp, request.getfixturevalue("run_dir"))
    page = browser.open(path.resolve().as_uri(), width=WINDOW_PX)
    yield outline(kind, path), page
    page.close()


# What the page looks like, worked out in the page by devtools (the page's own policy forbids
# scripts; Runtime.evaluate is not the page's script and is not subject to it).
OUTLINE_JS = """(() => {
  const shown = (el) => !!el && el.getClientRects().length > 0
      && getComputedStyle(el).visibility !== "hidden";
  const h1 = document.querySelector("h1");
  return {h1: shown(h1) ? h1.innerText.trim() : null,
          sections: [...document.querySelectorAll("section[id]")].map((s) => {
            const h2 = s.querySelector("h2");
            return [s.id, shown(s) && shown(h2) ? h2.innerText.trim().replace(/\\s+/g, " ")
                                                : null];
          })};
})()"""

# Every element that reaches past the window's right (or left) edge with no ancestor that
# scrolls it sideways; and every scroll container that hides part of its content.
OVERFLOW_JS = """(() => {
  const width = document.documentElement.clientWidth;
  const scrolls = (el) => ["auto", "scroll"].includes(getComputedStyle(el).overflowX);
  const named = (el) => el.tagName.toLowerCase() + (el.id ? "#" + el.id : "")
      + (el.classList.length ? "." + [...el.classList].join(".") : "");
  const where = (el) => {
    const up = el.closest("[id]");
    return named(el) + (up && up !== el ? " in #" + up.id : "");
  };
  const unscrolled = (node) => {  // no ancestor of node (a text's: its own element) scrolls
    let up = node.parentElement;
    while (up && up !== document.body && !scrolls(up)) up = up.parentElement;
    return !up || up === document.body;
  };
  const beyond = (box) => (box.width > 0 || box.height > 0)
      && (box.right > width + 0.5 || box.left < -0.5);
  const past = [], hidden = [], spilled = [];
  // text runs past the edge of the box that holds it without widening the box: ask the text
  const texts = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const range = document.createRange();
  for (let text = texts.nextNode(); text; text = texts.nextNode()) {
    if (!text.data.trim()) continue;
    range.selectNodeContents(text);
    const box = range.getBoundingClientRect();
    if (beyond(box) && unscrolled(text))
      past.push("text '" + text.data.trim().slice(0, 30) + "' in " + where(text.parentElement)
                + " to " + Math.round(box.right));
  }
  for (const el of document.body.querySelectorAll("*")) {
    const box = el.getBoundingClientRect();
    if (beyond(box) && unscrolled(el)) past.push(where(el) + " to " + Math.round(box.right));
    if (scrolls(el) && el.scrollWidth > el.clientWidth + 1)
      hidden.push(where(el) + " " + el.scrollWidth + " in " + el.clientWidth);
    if ((el.tagName === "TD" || el.tagName === "TH") && el.scrollWidth > el.clientWidth + 1)
      spilled.push(where(el) + " " + el.scrollWidth + " in " + el.clientWidth);
  }
  return {width: width, page: document.documentElement.scrollWidth,
          past: past.slice(0, 12), hidden: hidden, spilled: spilled.slice(0, 12),
          tables: [...document.querySelectorAll("table")].map((t) => {
            const box = t.getBoundingClientRect();
            return [where(t), Math.round(box.left), Math.round(box.right)];
          })};
})()"""

STYLE_JS = """(() => {
  const css = (sel, prop) => {
    const el = document.querySelector(sel);
    return el ? getComputedStyle(el)[prop] : null;
  };
  return {body_max_width: css("body", "maxWidth"), h2_border: css("h2", "borderBottomStyle"),
          swatch: css(".swatch", "backgroundColor"),
          svg_join: css("svg.chart path", "strokeLinejoin")};
})()"""

CSP_JS = """(() => {
  const meta = document.querySelector('meta[http-equiv="Content-Security-Policy" i]');
  const first = document.querySelector("style, link, script, svg");
  return meta && {content: meta.content, in_head: meta.parentElement === document.head,
                  before_all: !first || !!(meta.compareDocumentPosition(first)
                                           & Node.DOCUMENT_POSITION_FOLLOWING)};
})()"""


def policy(content: str) -> dict[str, list[str]]:
    """A Content-Security-Policy's directives and their sources."""
    parts = (p.split() for p in content.split(";") if p.strip())
    return {p[0].lower(): p[1:] for p in parts}


def test_the_headline_and_every_section_are_on_the_page(shown: tuple[Report, Page]) -> None:
    report, page = shown
    assert ALWAYS[report.kind] <= report.sections.keys()
    assert all(report.sections.values()), report.sections  # each section has its h2
    seen = page.evaluate(OUTLINE_JS)
    assert seen["h1"] == report.headline != ""
    assert dict(seen["sections"]) == report.sections  # each one there, shown, with its heading
    if report.kind in ("run", "trace"):  # the headline is the verdict's, embedded in the page
        from doctor.reports.text import headline
        from doctor.verdict import Verdict

        embedded = page.evaluate('document.getElementById("doctor-verdict").textContent')
        assert seen["h1"] == headline(Verdict.from_dict(json.loads(embedded)))


def test_no_request_leaves_the_page_and_nothing_fails(shown: tuple[Report, Page]) -> None:
    _report, page = shown
    meta = page.evaluate(CSP_JS)
    assert meta is not None, "no Content-Security-Policy <meta> in the page"
    assert meta["in_head"] and meta["before_all"], meta  # it governs everything after it only
    directives = policy(meta["content"])
    assert directives.get("default-src") == ["'none'"], meta["content"]
    sources = [s.lower() for values in directives.values() for s in values]
    assert not [s for s in sources if s not in ("'none'", "'unsafe-inline'", "data:")], sources
    assert directives.get("script-src", ["'none'"]) == ["'none'"]
    assert "'unsafe-inline'" not in directives.get("default-src", [])
    assert page.log().problems() == []


def test_the_styles_apply_under_the_policy(shown: tuple[Report, Page]) -> None:
    report, page = shown
    style = page.evaluate(STYLE_JS)
    assert style["body_max_width"] == "1040px"  # the <style> block
    assert style["h2_border"] == "solid"
    if report.kind in ("run", "trace"):
        assert style["swatch"] not in (None, "rgba(0, 0, 0, 0)")  # style="" attributes
        assert style["svg_join"] == "round"  # the charts' own <style> (the default is miter)


def test_nothing_is_wider_than_the_window_outside_a_scroll_container(
        shown: tuple[Report, Page]) -> None:
    _report, page = shown
    layout = page.evaluate(OVERFLOW_JS)
    assert layout["width"] == WINDOW_PX
    assert layout["past"] == []
    assert layout["page"] == WINDOW_PX  # no sideways scrolling of the whole page
    assert layout["spilled"] == []


def test_the_page_prints_without_cut_tables(shown: tuple[Report, Page]) -> None:
    _report, page = shown
    try:
        page.emulate_media("print")
        page.set_width(PRINT_PX)
        layout = page.evaluate(OVERFLOW_JS)
        body_width = page.evaluate('getComputedStyle(document.body).maxWidth')
    finally:
        page.emulate_media("")
        page.set_width(WINDOW_PX)
    assert layout["width"] == PRINT_PX and body_width == "none"  # the print rules are in force
    assert [t for t in layout["tables"] if t[1] < 0 or t[2] > PRINT_PX] == []
    assert layout["hidden"] == []  # paper does not scroll
    assert layout["past"] == []
    assert layout["spilled"] == []
    pdf = page.pdf()
    assert pdf.startswith(b"%PDF-") and len(re.findall(rb"/Type\s*/Page\b(?!s)", pdf)) >= 1


def test_the_checks_see_a_page_that_breaks_them(browser: Browser, tmp_path: Path) -> None:
    """A page with a remote image, a console error, a script its policy blocks and a table too
    wide for the window: the log and the layout check report each (so a pass above means
    something)."""
    bad = tmp_path / "bad.html"
    bad.write_text(
        "<!DOCTYPE html><html><head><meta http-equiv='Content-Security-Policy' "
        "content=\"default-src 'none'; img-src http:\"></head><body><h1>bad</h1>"
        "<img src='http://doctor.invalid/pixel.png'><script>console.error('boom')</script>"
        "<table><tr><td>" + "wide" * 200 + "</td></tr></table></body></html>")
    page = browser.open(bad.as_uri(), width=WINDOW_PX)
    try:
        problems = page.log().problems()
        layout = page.evaluate(OVERFLOW_JS)
    finally:
        page.close()
    assert any("request off the machine: http://doctor.invalid/pixel.png" in p for p in problems)
    assert any("failed load" in p and "pixel.png" in p for p in problems), problems
    assert any("Executing inline script violates" in p for p in problems), problems
    assert any(p.startswith("table") for p in layout["past"]), layout


def test_a_browser_that_never_answers_fails_in_time_and_is_killed(tmp_path: Path) -> None:
    """A hung browser fails the test at the driver's deadline instead of hanging CI, and is
    killed (it needs no Chromium: a script that sleeps plays the browser)."""
    pid_file = tmp_path / "pid"
    hung = tmp_path / "hung-browser"
    hung.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 60\n")
    hung.chmod(hung.stat().st_mode | stat.S_IXUSR)
    started = time.monotonic()
    with pytest.raises(BrowserUnavailable, match=r"did not answer.*in time"):
        Browser(str(hung), timeout_s=1.0)
    assert time.monotonic() - started < 10
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


def test_find_chromium_takes_doctor_chromium_first(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    mine = tmp_path / "my-chrome"
    mine.write_text("#!/bin/sh\n")
    mine.chmod(mine.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("DOCTOR_CHROMIUM", str(mine))
    assert find_chromium() == str(mine)
    monkeypatch.setenv("DOCTOR_CHROMIUM", str(tmp_path / "missing"))
    assert find_chromium() is None  # a wrong setting is not silently replaced by another browser
