"""The trace door (``doctor report TRACE``: analyze_traces) on the small traces committed in
tests/data/traces (recorded by doctor run of the CPU sample jobs; README.md there): the verdict
each one's row says, two ranks of one job merged, and the damaged copies read alike or refused in
one line. These need nothing beside the checkout: a clean clone runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from doctor.errors import TraceError
from doctor.pipeline import analyze_traces
from doctor.reports.json import render_json
from doctor.reports.text import render_text
from doctor.verdict import Verdict
from tests.support import DATA_TRACES

DEGRADED = DATA_TRACES / "degraded"

#: Each recorded trace's verdict through the trace door (as tests/data/traces/README.md says).
EXPECTED = {
    "input_bound.json.gz": ("input", {"input.unsplit", "trace.cpu_only"}),
    "elementwise_bound.json.gz": ("compute", {"compute.bound", "trace.cpu_only"}),
    "ddp_gloo_rank0.json.gz": ("communication", {"comm.exposed", "comm.scaling",
                                                 "trace.cpu_only"}),
    "ddp_gloo_rank1.json.gz": ("communication", {"comm.exposed", "comm.scaling",
                                                 "trace.cpu_only"}),
}


def verdict_of(*paths: Path) -> Verdict:
    return analyze_traces(list(paths)).verdict


def check_shares(verdict: Verdict) -> None:
    assert all(0.0 <= s <= 1.0 for s in verdict.shares.values()), verdict.shares
    assert sum(verdict.shares.values()) == pytest.approx(1.0, abs=1e-6)


def test_every_recorded_trace_has_its_row() -> None:
    assert sorted(p.name for p in DATA_TRACES.glob("*.json.gz")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_recorded_trace_gives_the_verdict_of_its_row(name: str) -> None:
    bottleneck, findings = EXPECTED[name]
    verdict = verdict_of(DATA_TRACES / name)
    assert verdict.bottleneck == bottleneck
    assert {f.id for f in verdict.findings} == findings
    check_shares(verdict)


def test_the_two_ranks_of_one_ddp_job_merge_into_one_verdict() -> None:
    analysis = analyze_traces([DATA_TRACES / f"ddp_gloo_rank{r}.json.gz" for r in (0, 1)])
    assert analysis.verdict.bottleneck == "communication"
    assert {"comm.exposed", "comm.scaling"} <= {f.id for f in analysis.verdict.findings}
    check_shares(analysis.verdict)
    table = analysis.tables.communication
    assert table is not None
    assert set(table["rank"]) == {0, 1}
    assert set(table["kind"]) == {"allreduce"}


def test_a_recorded_trace_is_reported_as_text_and_json() -> None:
    analysis = analyze_traces([DATA_TRACES / "input_bound.json.gz"])
    assert "input" in render_text(analysis)
    assert json.loads(render_json(analysis))["bottleneck"] == "input"


@pytest.mark.parametrize(("name", "says"), [
    ("cut_mid_event.json.gz", "truncated?"),
    ("cut_gzip_stream.json.gz", "cannot decompress"),
])
def test_a_cut_trace_is_refused_in_one_line_that_names_it(name: str, says: str) -> None:
    with pytest.raises(TraceError) as refused:
        verdict_of(DEGRADED / name)
    message = str(refused.value)
    assert "\n" not in message and name in message and says in message


def test_integers_past_64_bits_in_the_args_change_nothing() -> None:
    odd, plain = verdict_of(DEGRADED / "large_integers.json.gz"), verdict_of(
        DATA_TRACES / "input_bound.json.gz")
    assert odd.bottleneck == plain.bottleneck
    assert odd.shares == pytest.approx(plain.shares, abs=1e-12)
    assert {f.id for f in odd.findings} == {f.id for f in plain.findings}


def test_a_rank_without_its_distributed_info_keeps_its_shares() -> None:
    """Without distributedInfo the world size is unknown: no scaling finding, the rest alike."""
    alone = verdict_of(DEGRADED / "no_distributed_info.json.gz")
    full = verdict_of(DATA_TRACES / "ddp_gloo_rank1.json.gz")
    assert alone.bottleneck == full.bottleneck == "communication"
    assert alone.shares == pytest.approx(full.shares, abs=1e-12)
    assert {f.id for f in alone.findings} == {f.id for f in full.findings} - {"comm.scaling"}


def test_a_trace_of_no_events_says_it_found_no_steps() -> None:
    verdict = verdict_of(DEGRADED / "no_events.json.gz")
    assert verdict.bottleneck == "unknown"
    assert {f.id for f in verdict.findings} == {"steps.none"}
