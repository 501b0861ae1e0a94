"""Reports format hand-built Analyses: escaping, self-containment, content, round trips."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from markupsafe import escape

from doctor.analyse.analysis import Analysis, Tables
from doctor.reports import charts
from doctor.reports.html import environment, render_html
from doctor.reports.json import render_json
from doctor.reports.text import render_text
from doctor.verdict import (
    CATEGORIES,
    LEDGER_COLUMNS,
    Finding,
    Fix,
    ProbeStatus,
    Verdict,
)

HOSTILE_ARGV = ["python", "</script><img src=x onerror=alert(1)>.py", "--x=<b>\"'&"]

# Namespace URIs inside inline SVG name vocabularies; browsers never fetch them.
ALLOWED_URIS = ('xmlns="http://www.w3.org/2000/svg"', 'xmlns:xlink="http://www.w3.org/1999/xlink"')


def _ledger(steps: int, ranks: int = 1, warmup: int = 5, split: bool = True) -> pd.DataFrame:
    rng = np.random.default_rng(7)
    frames = []
    for rank in range(ranks):
        wall = 0.09 + 0.01 * rng.random(steps) + 0.002 * rank
        wall[:warmup] *= 4
        data: dict[str, object] = {
            "rank": np.full(steps, rank),
            "step": np.arange(steps),
            "start_s": np.cumsum(wall) - wall,
            "wall_s": wall,
        }
        weights = {"io": 0.01, "decode": 0.83, "preprocess": 0.05, "transfer": 0.0,
                   "compute": 0.08, "communication": 0.0, "other": 0.03}
        for cat in CATEGORIES:
            data[cat] = wall * weights[cat] if split else np.zeros(steps)
        data["warmup"] = np.arange(steps) < warmup
        data["analyzed"] = np.arange(steps) >= warmup
        frames.append(pd.DataFrame(data, columns=list(LEDGER_COLUMNS)))
    return pd.concat(frames, ignore_index=True)


def _findings() -> list[Finding]:
    return [
        Finding(
            id="input.decode", category="decode", severity="critical",
            title="Decoding JPEGs in the main process takes 83% of each step",
            evidence={"decode_share": 0.83, "num_workers": 0, "cores": 2,
                      "median_wait_s": 0.0754, "path": "/data/<img src=x onerror=alert(2)>"},
            fixes=(
                Fix("num_workers 0 -> 2", "2 cores, and the main process decodes every batch",
                    'DataLoader(ds, batch_size=64, num_workers=2,\n'
                    '           persistent_workers=True)  # "decode" off the loop'),
                Fix("Decode with simplejpeg", "Pillow decode dominates the samples",
                    "img = simplejpeg.decode_jpeg(buf)"),
            ),
            estimated_speedup=5.2,
        ),
        Finding(
            id="host.contention", category="compute", severity="warning",
            title="12 runnable threads on 2 cores",
            evidence={"threads": 12, "cores": 2},
            fixes=(Fix("Limit intra-op threads", "torch uses one thread per core by default",
                       "OMP_NUM_THREADS=1 doctor run train.py"),),
            estimated_speedup=1.8,
        ),
        Finding(id="steps.warmup", category="other", severity="info",
                title="First 5 steps are warm-up"),
    ]


def _probes() -> dict[str, ProbeStatus]:
    return {
        "steps": ProbeStatus(True),
        "dataloader": ProbeStatus(True),
        "gpu": ProbeStatus(False, "NVML library not found", "install nvidia-ml-py on a GPU host"),
        "stacks": ProbeStatus(False, "ptrace refused (ptrace_scope=1)",
                              "docker run --cap-add SYS_PTRACE"),
    }


def _shares(**over: float) -> dict[str, float]:
    shares = {"io": 0.01, "decode": 0.83, "preprocess": 0.05, "transfer": 0.0,
              "compute": 0.08, "communication": 0.0, "other": 0.03}
    shares.update(over)
    return shares


def input_bound() -> Analysis:
    verdict = Verdict(
        bottleneck="decode", shares=_shares(),
        steps={"count": 80, "analyzed": 75, "median_s": 0.0912},
        findings=_findings(), probes=_probes(),
        job={"argv": HOSTILE_ARGV, "exit_code": 0, "ranks": 1, "device": "cpu",
             "host": "box", "cores": 2, "torch_version": "2.13.0", "duration_s": 12.5},
        notes=["first 5 steps are warm-up and left out"],
        rules_skipped={"gpu.starved": "needs gpu_counters"},
    )
    tables = Tables(
        loaders=pd.DataFrame({"num_workers": [0], "pin_memory": [False],
                              "prefetch_factor": [None], "persistent_workers": [False]}),
        top_functions=pd.DataFrame({"category": ["decode", "compute"],
                                    "function": ["PIL.Image.open <module>", "conv2d"],
                                    "share": [0.8, 0.08]}),
        processes=pd.DataFrame({"pid": [101, 102], "role": ["main", "worker"],
                                "cpu_pct": [99.5, 0.0]}),
        # a table without a title of its own (TABLE_TITLES): its name is its title
        gpu_steps=pd.DataFrame({"a": range(250), "b_s": np.linspace(0, 1, 250)}),
    )
    return Analysis(verdict, _ledger(80), "doctor-runs/2024-01-01-train", tables)


def empty() -> Analysis:
    verdict = Verdict(
        bottleneck="unknown", shares=dict.fromkeys(CATEGORIES, 0.0),
        steps={"count": 0, "analyzed": 0, "median_s": None},
        findings=[Finding(id="steps.none", category="other", severity="critical",
                          title="No training steps were seen",
                          fixes=(Fix("Mark steps by hand", "no optimizer or DataLoader was used",
                                     "doctor.step()"),))],
        probes=_probes(), job={"argv": ["python", "noop.py"], "exit_code": 0, "ranks": 1,
                               "device": "cpu"},
    )
    return Analysis(verdict, pd.DataFrame(columns=list(LEDGER_COLUMNS)), "doctor-runs/empty")


def partial() -> Analysis:
    analysis = input_bound()
    analysis.verdict.partial = True
    analysis.verdict.job["exit_code"] = 130
    analysis.verdict.steps = {"count": 30, "analyzed": 25, "median_s": 0.09}
    analysis.ledger = _ledger(30)
    return analysis


def trace_only() -> Analysis:
    shares = _shares(io=0.0, decode=0.0, preprocess=0.0, input=0.6, compute=0.3, other=0.1)
    verdict = Verdict(
        bottleneck="input", shares=shares,
        steps={"count": 40, "analyzed": 40, "median_s": 0.2},
        findings=[Finding(id="input.unsplit", category="input", severity="warning",
                          title="Input wait is 60% of the step; a trace cannot split it",
                          evidence={"input_share": 0.6, "ranks": 4},
                          fixes=(Fix("Run under doctor", "doctor run sees the loading code",
                                     "doctor run torchrun --nproc-per-node 4 train.py"),),
                          estimated_speedup=2.5)],
        probes={"torch_ops": ProbeStatus(True)},
        job={"argv": [], "exit_code": None, "ranks": 4, "device": "cuda"},
    )
    ledger = _ledger(40, ranks=4, warmup=0, split=False)
    ranks = pd.DataFrame({"rank": range(4), "median_step_s": [0.2, 0.21, 0.2, 0.25],
                          "input_share": [0.6, 0.58, 0.61, 0.7]})
    return Analysis(verdict, ledger, "rank0.json.gz rank1.json.gz", Tables(ranks=ranks))


ALL = {"input_bound": input_bound, "empty": empty, "partial": partial, "trace_only": trace_only}


@pytest.fixture(params=sorted(ALL))
def analysis(request: pytest.FixtureRequest) -> Analysis:
    return ALL[request.param]()


def test_hostile_command_line_is_escaped() -> None:
    html = render_html(input_bound())
    assert "<img src=x onerror" not in html
    assert "<b>" not in html
    assert "&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;.py" in html
    assert "--x=&lt;b&gt;&#34;" in html
    assert "/data/&lt;img src=x onerror=alert(2)&gt;" in html
    # The only script element is the JSON data block, and it is closed once.
    assert html.count("<script") == 1
    assert html.count("</script>") == 1
    assert '<script type="application/json" id="doctor-verdict">' in html
    for svg in re.findall(r"<svg.*?</svg>", html, flags=re.DOTALL):
        assert "onerror" not in svg and ".py" not in svg


def test_html_references_no_external_resource(analysis: Analysis) -> None:
    html = render_html(analysis)
    stripped = html
    for uri in ALLOWED_URIS:
        stripped = stripped.replace(uri, "")
    lowered = stripped.lower()
    for needle in ('src="http', "src='http", 'href="http', "href='http", "@import",
                   "<link", "<script src", "<iframe", "<img", "http://", "https://", "//cdn"):
        assert needle not in lowered, needle
    # References inside the page (clip paths, anchors) are fine; anything else is a fetch.
    assert re.search(r"<[a-z][^>]*\s(src|href)\s*=\s*(?![\"']?#)", lowered) is None
    assert re.search(r"url\(\s*(?![\"']?#)", lowered) is None


def test_html_shows_every_finding_and_fix(analysis: Analysis) -> None:
    html = render_html(analysis)
    assert html.startswith("<!DOCTYPE html>")
    for finding in analysis.verdict.findings:
        assert str(escape(finding.title)) in html
        for fix in finding.fixes:
            assert str(escape(fix.title)) in html
            assert str(escape(fix.code)) in html
            assert str(escape(fix.why)) in html
    for name, probe in analysis.verdict.probes.items():
        assert f"<code>{name}</code>" in html
        assert str(escape(probe.reason)) in html
        assert str(escape(probe.hint)) in html


def test_html_content_of_an_input_bound_run() -> None:
    html = render_html(input_bound())
    assert "Input-bound: decoding samples (83% of step time)" in html
    assert "median step 91.2 ms, 75 of 80 steps analysed" in html
    assert "≈5.2x" in html and "≈1.8x" in html
    assert '<pre><code>DataLoader(ds, batch_size=64, num_workers=2,' in html
    assert "PARTIAL" not in html
    assert html.count("<svg") == 2
    assert "warm-up" in html
    assert "first 5 steps are warm-up and left out" in html
    for title in ("DataLoader settings", "Where the time goes, by function", "CPU per process",
                  "Gpu steps"):
        assert title in html
    assert "50 more rows not shown" in html
    assert "NVML library not found" in html
    assert "12.50 s" in html  # duration_s, formatted
    assert "rules_skipped" in html and "gpu.starved" in html  # the verdict's figures


def test_html_embeds_the_verdict_as_json() -> None:
    analysis = input_bound()
    html = render_html(analysis)
    block = re.search(r'<script type="application/json" id="doctor-verdict">(.*?)</script>', html,
                      flags=re.DOTALL)
    assert block is not None
    assert json.loads(block.group(1)) == json.loads(render_json(analysis))


def test_empty_ledger_says_no_steps_recorded() -> None:
    html = render_html(empty())
    assert "No steps recorded." in html
    assert "No shares: no steps were analysed." in html
    assert "<svg" not in html
    assert "No verdict" in html
    assert charts.step_time_chart(pd.DataFrame(columns=list(LEDGER_COLUMNS))) is None
    text = render_text(empty())
    assert "No verdict" in text
    assert "No training steps were seen" in text


def test_partial_is_marked() -> None:
    html = render_html(partial())
    assert "PARTIAL: the job stopped with exit status 130" in html
    assert render_text(partial()).startswith("PARTIAL: the job stopped with exit status 130")


def test_a_job_that_ended_well_is_not_said_interrupted() -> None:
    """Partial only because a record could not be read (hostile review: it read "the job was
    interrupted" for a job that exited 0); a job doctor did not see end may still run."""
    from doctor.reports.text import partial_line

    verdict = partial().verdict
    verdict.job["exit_code"] = 0
    assert partial_line(verdict).startswith("PARTIAL: some of the run's records could not be read")
    verdict.job["exit_code"] = None
    assert "still running" in partial_line(verdict)


def test_trace_only_with_input_share_and_ranks() -> None:
    analysis = trace_only()
    html = render_html(analysis)
    assert "Input-bound: waiting for the DataLoader (60% of step time)" in html
    assert "one line per rank" in html
    for rank in range(4):
        assert f"rank {rank}" in html
    assert "Per rank: step time and shares" in html
    assert "none (the job did not finish)" in html
    shares_svg = charts.shares_chart(analysis.verdict.shares, "input")
    assert shares_svg is not None and ">input<" in shares_svg
    text = render_text(analysis, full=True)
    assert "input" in text and "Input wait is 60% of the step" in text


def test_charts_stay_small_for_long_runs() -> None:
    ledger = _ledger(20_000)
    svg = charts.step_time_chart(ledger)
    assert svg is not None
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert len(svg) < 120_000
    many = charts.step_time_chart(_ledger(5_000, ranks=16, warmup=3))
    assert many is not None and len(many) < 400_000
    analysis = input_bound()
    analysis.ledger = ledger
    assert len(render_html(analysis)) < 250_000


def test_text_summary_names_bottleneck_and_top_finding() -> None:
    analysis = input_bound()
    text = render_text(analysis, width=80, report_path="doctor-runs/x/report.html")
    assert "Input-bound: decoding samples" in text
    assert "median step 91.2 ms, 75 of 80 steps analysed" in text
    assert "Decoding JPEGs in the main process takes 83% of each step" in text
    assert "~5.2x" in text
    assert "num_workers 0 -> 2" in text
    assert "persistent_workers=True" in text
    assert "Decode with simplejpeg" not in text  # only the first fix in the summary
    assert "12 runnable threads" not in text  # only the top finding
    assert "gpu: NVML library not found (hint: install nvidia-ml-py on a GPU host)" in text
    assert "Report: doctor-runs/x/report.html" in text
    assert "steps: " not in text  # probes that ran are not listed
    assert all(len(line) <= 80 for line in text.splitlines() if not line.startswith("        "))


def test_full_text_has_every_finding_and_the_job() -> None:
    text = render_text(input_bound(), full=True)
    for finding in input_bound().verdict.findings:
        assert finding.title in text
        for fix in finding.fixes:
            assert fix.title in text
    assert "evidence: decode_share = 83%" in text
    assert "onerror=alert(1)" in text  # the command, as typed (a terminal does not run HTML)


def test_text_strips_terminal_escapes() -> None:
    analysis = empty()
    analysis.verdict.probes["gpu"] = ProbeStatus(False, "bad \x1b[31mred\x1b[0m reason")
    text = render_text(analysis)
    assert "\x1b" not in text
    assert "bad [31mred[0m reason" in text


def test_json_round_trips(analysis: Analysis) -> None:
    text = render_json(analysis)
    assert text.endswith("\n")
    data = json.loads(text)
    assert data["schema"] == "doctor.verdict/1"
    again = Verdict.from_dict(data)
    assert again.to_dict() == analysis.verdict.to_dict()


def test_environment_is_cached_and_autoescapes() -> None:
    env = environment()
    assert env is environment()
    assert env.from_string("{{ x }}").render(x="<i>") == "&lt;i&gt;"


def test_evidence_values_carry_their_units() -> None:
    from doctor.reports.text import format_value

    assert format_value("median_step_s", 0.072) == "72.0 ms"
    assert format_value("read_mb_per_s", 466.2) == "466.2 MB/s"  # a rate, not seconds
    assert format_value("samples_per_s", 12.5) == "12.5 samples/s"
    assert format_value("comm_s_per_step", 0.0317) == "31.7 ms"  # seconds a step


def test_nested_evidence_reads_as_words_with_units_not_json() -> None:
    from doctor.reports.text import format_value

    bubble = {"schedule": "GPipe", "theory": 1 / 3, "by_rank": {"0": 0.41},
              "transfer_s_per_step": {"0": 0.000362, "1": 0.0012},
              "phases": [{"phase": "forward all-gathers", "seconds": 0.018, "bytes": 6 * 2**20}]}
    text = format_value("pipeline_bubble", bubble)
    assert text == ("{schedule: GPipe, theory: 0.3333, by_rank: {0: 0.41}, "
                    "transfer_s_per_step: {0: 362 µs, 1: 1.2 ms}, "
                    "phases: [{phase: forward all-gathers, seconds: 18.0 ms, bytes: 6.0 MiB}]}")
    assert format_value("waits_s", {"0": 0.5}) == "{0: 500.0 ms}"  # a rank's: its parent's unit


def test_probes_off_for_one_reason_are_named_together_once() -> None:
    from doctor.reports.text import render_text

    reason = "no Python process of the job recorded anything"
    probes = {"steps": ProbeStatus(False, reason), "dataloader": ProbeStatus(False, reason),
              "gpu": ProbeStatus(False, "NVML library not found", "needs a GPU"),
              "host": ProbeStatus(True)}
    analysis = input_bound()
    text = render_text(replace(analysis, verdict=replace(analysis.verdict, probes=probes)))
    assert text.count(reason) == 1
    assert f"steps, dataloader: {reason}" in text
    assert "gpu: NVML library not found (hint: needs a GPU)" in text
