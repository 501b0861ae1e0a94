"""The analysis's sections (doctor.analyse.analysis.Sections) are what the reports format: the
figures a report line shows are the records' own (worked out in the analysis), and
reports/json.py alone turns the records into verdict.json's dicts, in verdict.json's order."""

from __future__ import annotations

import pandas as pd
import pytest

from doctor.analyse.analysis import Analysis, Sections, Tables
from doctor.analyse.comm_model import LinkFit, RankComm, ScalePoint
from doctor.analyse.comms import CommModel, Link
from doctor.analyse.kind_scaling import KindScaling
from doctor.analyse.ops import RankOps
from doctor.categories import CATEGORIES
from doctor.reports.json import verdict_data
from doctor.reports.resource_lines import comm_lines, ops_lines
from doctor.verdict import LEDGER_COLUMNS, Verdict


def comm_model(rank: int, exposed_s: float, step_s: float = 0.2,
               link: Link | None = None) -> CommModel:
    m = RankComm(rank=rank, world=2, step_s=step_s, comm_s=0.1, exposed_s=exposed_s,
                 bytes_per_step=100 * 2**20, calls_per_step=1.0, cap_bytes=25 * 2**20,
                 last_bucket_bytes=25 * 2**20, capacity_s=0.05, backward_s=0.08,
                 fp32_grads=True, link=LinkFit(5e-5, 1.23456e9, 8, "fit"), scale=1.0)
    points = (ScalePoint(2, step_s, exposed_s, False), ScalePoint(4, 0.15, 0.06, False),
              ScalePoint(8, 0.125, 0.0612345, False))
    return CommModel(m, (), points, link)


def test_the_communication_figures_are_the_models_own() -> None:
    model = comm_model(0, 0.05, link=Link("TCP loopback", 2.46913, "measured"))
    assert model.bus_gb_per_s == pytest.approx(1.23456)
    assert model.link is not None and model.link.shown_gb_per_s == 2.469  # as verdict.json
    assert model.of_link == pytest.approx(1.23456 / 2.469)  # against the bandwidth shown
    assert model.exposed_share == pytest.approx(0.25)
    far = model.far_point()
    assert far is not None and far.ranks == 8 and far.shown_exposed_share == 0.4899
    assert comm_model(0, 0.05, step_s=0.0).exposed_share is None
    assert comm_model(0, 0.05).of_link is None  # no link known
    (line,) = comm_lines(Sections(models={0: model}))
    assert "1.23 GB/s bus (50% of TCP loopback's 2.47 GB/s)" in line
    assert "exposed 25% of the step" in line and "at 8 ranks 49%" in line


def test_the_ops_line_takes_the_top_ops_time_by_class_from_the_record() -> None:
    # an op with no cost has no class: "" (doctor.analyse.roofline.classify)
    table = pd.DataFrame({"op": ["mm", "add", "copy", "x"], "bound": ["compute", "memory",
                                                                        "memory", ""],
                          "time_s": [4.0, 2.0, 1.0, 1.0], "share": [0.5, 0.25, 0.125, 0.125]})
    ops = RankOps(rank=0, table=table, roofs=None, mfu=0.3, mfu_dtype="fp32", window_s=8.0)
    assert ops.top_by_bound() == {"compute": 0.5, "memory": 0.375}  # the largest first
    assert ops_lines(Sections(ops={0: ops})) == [
        "Ops, rank 0: compute-bound 50%, memory-bound 38% of the op time; "
        "model FLOP utilisation 30% (fp32)"]
    assert ops_lines(Sections()) == []


def test_verdict_json_holds_the_verdicts_keys_then_each_section_in_order() -> None:
    verdict = Verdict(bottleneck="communication", shares=dict.fromkeys(CATEGORIES, 0.0) | {
        "communication": 1.0}, steps={}, findings=[], probes={}, job={"argv": ["python"]},
        bottleneck_share=1.0, rules_skipped={"gpu.starved": "needs gpus"})
    table = pd.DataFrame({"op": ["mm"], "bound": ["compute"], "time_s": [1.0], "share": [1.0]})
    sections = Sections(ops={0: RankOps(0, table, None, None, None, 1.0)},
                        models={0: comm_model(0, 0.05), 1: comm_model(1, 0.07)})
    analysis = Analysis(verdict, pd.DataFrame(columns=list(LEDGER_COLUMNS)), "src", Tables(),
                        sections)
    data = verdict_data(analysis)
    assert list(data) == ["schema", "bottleneck", "shares", "steps", "findings", "probes", "job",
                          "partial", "notes", "bottleneck_share", "rules_skipped", "ops",
                          "comm_model"]
    assert [m["rank"] for m in data["comm_model"]] == [0, 1]
    assert data["ops"][0]["top"] == [{"op": "mm", "bound": "compute", "time_s": 1.0,
                                      "share": 1.0}]
    assert list(verdict_data(Analysis(verdict, analysis.ledger, "src"))) == list(data)[:-2]
    (line,) = comm_lines(sections)
    assert line.startswith("Communication, rank 1:")  # the rank with the most exposed


def test_a_sharded_jobs_scaling_is_its_own_line_and_verdict_key() -> None:
    points = (ScalePoint(2, 0.2, 0.1, False), ScalePoint(4, 0.19, 0.14, False),
              ScalePoint(8, 0.2, 0.18, True))
    scale = KindScaling("sharded", points, "words")
    sections = Sections(scaling=scale)
    (line,) = comm_lines(sections)  # no DDP model: the kind's own scaling
    assert line.startswith("Scaling (sharded): exposed 50% of the step at 2 ranks; at 8 ranks")
    assert "90%, scaling efficiency 25%" in line
    verdict = Verdict(bottleneck="communication", shares=dict.fromkeys(CATEGORIES, 0.0),
                      steps={}, findings=[], probes={}, job={})
    data = verdict_data(Analysis(verdict, pd.DataFrame(columns=list(LEDGER_COLUMNS)), "src",
                                 Tables(), sections))
    assert data["scaling"]["kind"] == "sharded"
    assert [p["ranks"] for p in data["scaling"]["points"]] == [2, 4, 8]
    assert data["scaling"]["points"][2]["across_nodes"] is True
    pipe = Sections(scaling=KindScaling("pipeline", points, "words"))
    assert comm_lines(pipe)[0].startswith("Scaling (pipeline): not computing 50% of the step "
                                          "at 2 stages; at 8 stages")
