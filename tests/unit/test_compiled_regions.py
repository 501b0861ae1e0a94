"""Compiled kernels tied to their region in the op table (doctor.trace.compiled_regions): the
ops inside a ``Torch-Compiled Region`` (and the compiled backward) carry its id, Inductor's
own code is of kind ``compiled``, the eager ops around the graphs carry none, and the share of
op time outside the compiled graphs makes a graph break a warning."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from doctor.analyse.compile_causes import GraphBreak
from doctor.analyse.compiles import Compiles
from doctor.analyse.ops import RankOps
from doctor.rules.compiles import graph_breaks
from doctor.trace.events import build_timeline, load_timeline
from doctor.trace.ops import op_table

INDUCTOR_TRACE = Path(__file__).parent.parent / "data" / "compile_runs" / \
    "inductor_cpu_trace.json.gz"


def op(name: str, ts: float, dur: float, tid: int = 1) -> dict[str, object]:
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "tid": tid,
            "args": {}}


def test_a_real_inductor_cpu_trace_ties_its_compiled_code_to_its_regions() -> None:
    # recorded on this machine: torch.compile (Inductor, C++) of a 2-layer MLP, 3 steps of
    # forward and backward; the loss (square, mean) eager
    table = op_table(load_timeline(INDUCTOR_TRACE)).set_index("op")
    graphs = table[table.index.str.startswith("## Call CompiledFxGraph")]
    assert sorted(graphs["region"]) == ["0/0", "backward"]  # forward graph and backward graph
    assert set(graphs["kind"]) == {"compiled"}
    assert table.loc["aten::addmm", "region"] == "0/0"  # Inductor's extern GEMM, forward
    assert table.loc["aten::mm", "region"] == "backward"
    for eager in ("aten::pow", "aten::mean"):  # the loss, outside the compiled model
        assert table.loc[eager, "region"] == "" and table.loc[eager, "compiled_self_s"] == 0
    inside = table["compiled_self_s"].sum() / table["self_s"].sum()
    assert inside > 0.9


def test_regions_split_by_a_graph_break_on_their_own_thread() -> None:
    events = [
        op("Torch-Compiled Region: 0/0", 0, 100),
        op("## Call CompiledFxGraph abc ##", 10, 80),
        op("aten::abs", 120, 40),  # the break: eager between the two graphs
        op("aten::sum", 130, 20),  # inside the eager abs's time, still eager
        op("Torch-Compiled Region: 1/0", 200, 100),
        op("## Call CompiledFxGraph def ##", 210, 60),
        op("aten::mm", 220, 40),
        op("aten::mm", 250, 30, tid=2),  # another thread at the same time: not in the region
        op("Torch-Compiled Region", 400, 50),  # a torch that names no id
        op("aten::add", 410, 20),
    ]
    table = op_table(build_timeline(events)).set_index("op")
    assert table.loc["## Call CompiledFxGraph abc ##", "region"] == "0/0"
    assert table.loc["## Call CompiledFxGraph def ##", "region"] == "1/0"
    assert table.loc["aten::abs", "region"] == "" and table.loc["aten::sum", "region"] == ""
    # aten::mm: 40 us in region 1/0, 30 us eager on thread 2
    assert table.loc["aten::mm", "region"] == "1/0"
    assert table.loc["aten::mm", "compiled_self_s"] == pytest.approx(40e-6)
    assert table.loc["aten::add", "region"] == "compiled"


def test_a_trace_without_regions_has_none() -> None:
    table = op_table(build_timeline([op("aten::mm", 0, 10), op("aten::add", 20, 5)]))
    assert set(table["region"]) == {""} and table["compiled_self_s"].sum() == 0


def ops_of(inside_s: float, outside_s: float) -> RankOps:
    table = pd.DataFrame({"op": ["## Call CompiledFxGraph a ##", "aten::abs"],
                          "self_s": [inside_s, outside_s], "device_s": [0.0, 0.0],
                          "region": ["0/0", ""], "compiled_self_s": [inside_s, 0.0],
                          "compiled_device_s": [0.0, 0.0]})
    return RankOps(rank=0, table=table, roofs=None, mfu=None, mfu_dtype=None, window_s=1.0)


@pytest.mark.parametrize(("outside_s", "severity"), [(0.1, "info"), (0.5, "warning")])
def test_one_break_is_a_warning_where_much_runs_outside_the_graphs(outside_s: float,
                                                                  severity: str) -> None:
    compiles = Compiles(rank=0, compilations=2, recompilations=0, first_s=1.0, recompile_s=0.0,
                        run_s=10.0, steps_compiling=1, most_recompiled=(0, 0),
                        breaks=(GraphBreak("Data-dependent branching", "model.py", 12, 1),))
    ev = SimpleNamespace(compiles={0: compiles}, ops={0: ops_of(1.0 - outside_s, outside_s)})
    [finding] = graph_breaks(ev)  # type: ignore[arg-type]
    assert finding.severity == severity
    assert finding.evidence["eager_share_of_ops"] == pytest.approx(outside_s)
    assert f"{outside_s:.0%} of the op time in the profiled steps ran outside" in finding.title
