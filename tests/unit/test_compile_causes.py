"""Why torch.compile recompiled and where it broke the graph: Dynamo's own reasons, recorded
from a real CPU run (tests/data/compile_runs), grouped by kind of cause with their count and
seconds and the fix that fits each; graph breaks named at the job's line; the recorder reads
Dynamo's guard failures and graph-break log without a word on the job's output, and says
nothing where a torch keeps neither."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from doctor.analyse.compile_causes import guard_kind
from doctor.pipeline import analyze_run
from doctor.probes.compile_causes import CompileCauses, graph_break, guard_reason
from doctor.record.session import Session
from doctor.reports.json import verdict_data
from doctor.store.records import compile_key
from tests.support import FakeClock, compiled_loop

RECORDED = Path(__file__).parent.parent / "data" / "compile_runs" / "recompile_causes.json"


def replayed(run_dir: Path, causes: dict | None = None) -> None:
    """A loop whose first steps each hold one compilation of the recorded run (its seconds
    and ring key, in order), with the recorded reasons (or ``causes``) in the process's
    meta."""
    recorded = json.loads(RECORDED.read_text())
    plan = {i: (c["seconds"], c["key"]) for i, c in enumerate(recorded["compilations"])}
    compiled_loop(run_dir, 60, plan,
                  meta={"compile_causes": causes or recorded["compile_causes"]})


def test_recorded_recompilations_are_grouped_by_cause_with_their_cost(tmp_path: Path) -> None:
    replayed(tmp_path)
    found = {f["id"]: f for f in verdict_data(analyze_run(tmp_path))["findings"]}
    rec = found["compile.recompiles"]
    causes = {c["kind"]: c for c in rec["evidence"]["causes"]}
    # 3 batch sizes: two recompilations of each graph; then a new dtype; then a Python value
    assert {k: c["recompilations"] for k, c in causes.items()} == {"size": 4, "dtype": 1,
                                                                  "value": 1}
    compilations = json.loads(RECORDED.read_text())["compilations"]

    def seconds_of(keys: set[int]) -> float:  # each with the deferred ones after it
        total, mine = 0.0, False
        for c in compilations:
            mine = c["key"] in keys if c["key"] >= 0 else mine
            total += c["seconds"] if mine else 0.0
        return total

    assert causes["size"]["seconds"] == pytest.approx(seconds_of({1, 1001, 2, 1002}))
    assert causes["dtype"]["seconds"] == pytest.approx(seconds_of({3}))
    assert rec["evidence"]["causes"][0]["kind"] == "size"  # the costliest first
    assert "an input's size changed (4x" in rec["title"]
    assert "size mismatch at index 0" in rec["title"] and "train.py:6" in rec["title"]
    # the fixes of each cause, the costliest's first; no generic "see why" when all are known
    titles = [f["title"] for f in rec["fixes"]]
    assert titles == ["Compile for the shapes that vary", "Pad the inputs to a few fixed lengths",
                      "Give the compiled code one dtype",
                      "Pass the changing number as a tensor, or keep it constant",
                      "Measure the job uncompiled: is compiling worth it here?"]
    assert rec["fixes"][-1]["apply"] == {"torch": {"compile": "off"}}


def test_a_recorded_graph_break_names_the_line_to_change(tmp_path: Path) -> None:
    replayed(tmp_path)
    found = {f["id"]: f for f in verdict_data(analyze_run(tmp_path))["findings"]}
    brk = found["compile.graph_breaks"]
    assert brk["severity"] == "info"  # one break: said, not a warning
    assert brk["evidence"]["breaks"] == [{"reason": "Data-dependent branching",
                                          "where": "train.py:8", "times_met": 4}]
    assert brk["fixes"][0]["title"] == "Change train.py:8 (Data-dependent branching)"


def test_a_guard_failure_past_the_recompile_limit_is_refused_not_recompiled(
        tmp_path: Path) -> None:
    # recorded on this machine: 12 input lengths, frame 0 recompiled 7 times, the 8th refused
    guard = "tensor 'x' size mismatch at index 1. expected {}, actual {}"
    rows = [{"frame": 0, "nth": k, "reason": guard.format(8 + 8 * k, 16 + 8 * k),
             "function": "forward", "file": "train.py", "line": 38} for k in range(1, 8)]
    rows.append({**rows[-1], "nth": None})
    plan = {5 * k: (0.3, compile_key(0, k)) for k in range(8)}
    compiled_loop(tmp_path, 60, plan, meta={"compile_causes": {"recompiles": rows}})
    rec = {f["id"]: f for f in verdict_data(analyze_run(tmp_path))["findings"]}[
        "compile.recompiles"]
    [cause] = rec["evidence"]["causes"]
    assert (cause["recompilations"], cause["refused"]) == (7, 1) == (
        rec["evidence"]["recompilations"], 1)
    assert cause["seconds"] == pytest.approx(7 * 0.3)
    assert "(7x, 2.1 s, 1 more past the limit: eager;" in rec["title"]


def test_many_breaks_are_a_warning_naming_the_most_met(tmp_path: Path) -> None:
    replayed(tmp_path, {"graph_breaks": [
        {"reason": f"reason {n}", "file": "model.py", "line": 10 * n, "count": n}
        for n in range(1, 6)]})
    found = {f["id"]: f for f in verdict_data(analyze_run(tmp_path))["findings"]}
    brk = found["compile.graph_breaks"]
    assert brk["severity"] == "warning" and brk["evidence"]["graph_breaks"] == 5
    assert [f["title"] for f in brk["fixes"]] == [
        "Change model.py:50 (reason 5)", "Change model.py:40 (reason 4)",
        "Change model.py:30 (reason 3)"]


@pytest.mark.parametrize(("guard", "kind"), [
    ("tensor 'x' size mismatch at index 1. expected 16, actual 24", "size"),
    ("tensor 'L['x']' size mismatch at index 1. expected 16, actual 24", "size"),  # torch 2.1
    ("L['x'].size()[1] == 16", "size"),
    ("len(L['xs']) == 3", "size"),
    ("tensor 'x' dtype mismatch. expected Float, actual Double", "dtype"),
    ("tensor 'x' dispatch key set mismatch. expected DispatchKeySet(CPU), actual ...", "device"),
    ("tensor 'x' requires_grad mismatch. expected requires_grad=0", "requires_grad"),
    ("tensor 'x' stride mismatch at index 0. expected 8, actual 1", "layout"),
    ("L['self'].training == True", "mode"),
    ("___check_type_id(L['x'], 94458512)", "type"),
    ("___check_obj_id(L['self'].act, 140234)", "object"),
    ("n == 2", "value"),
    ("L['lr'] == 0.001", "value"),
    ("something new", "other"),
])
def test_guard_kinds_read_from_words_every_version_uses(guard: str, kind: str) -> None:
    assert guard_kind(guard) == kind


def test_guard_lines_and_break_messages_are_read_as_dynamo_writes_them() -> None:
    assert guard_reason("0/1: tensor 'x' size mismatch at index 1. expected 4, actual 8") == \
        (0, "tensor 'x' size mismatch at index 1. expected 4, actual 8")
    assert guard_reason('2/0: n == 2        # print("hi") if n < 0  # a.py:7 in f\n'
                        'User stack trace:\n  File "a.py", line 7') == (2, "n == 2")
    assert guard_reason("L['n'] == 2") == (None, "L['n'] == 2")  # a torch without the id
    torch_dir = "/site/torch/"
    today = ("Graph break in user code at /site/torch/nn/modules/module.py:1776\n"
             "Graph Break Reason: Data-dependent branching\n  Explanation: ...\n\n"
             "User code traceback:\n"
             '  File "/job/train.py", line 40, in step\n    out = model(x)\n'
             '  File "/job/model.py", line 12, in forward\n    if y.sum() > 0:\n'
             '  File "/site/torch/nn/modules/module.py", line 1776, in _call_impl\n')
    assert graph_break(today, torch_dir) == ("Data-dependent branching", "/job/model.py", 12)
    duplicate = ("Graph break (user stack suppressed due to duplicate graph break) in user "
                 "code at /job/model.py:12\nGraph Break Reason: Data-dependent branching")
    assert graph_break(duplicate, torch_dir) == ("Data-dependent branching", "/job/model.py", 12)
    older = ("Graph break: call_function BuiltinVariable(print) from user code at:\n"
             '  File "/job/model.py", line 20, in forward\n    print(x)\n')
    assert graph_break(older, torch_dir) == ("call_function BuiltinVariable(print)",
                                             "/job/model.py", 20)
    assert graph_break("Graph break: nothing to say where", torch_dir) is None


def test_the_recorder_reads_a_real_compile_silently_and_puts_the_log_back(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch._dynamo")
    import torch
    import torch._dynamo

    guards = sys.modules["torch._dynamo.guards"]
    if not isinstance(getattr(guards, "guard_failures", None), dict):
        pytest.skip("this torch keeps no guard_failures")
    torch._dynamo.reset()
    loggers = [lg for n, lg in logging.Logger.manager.loggerDict.items()
               if n.startswith("torch.") and n.endswith(".__graph_breaks")
               and isinstance(lg, logging.Logger)]
    before = [(lg.level, lg.propagate, list(lg.handlers)) for lg in loggers]
    session = Session(tmp_path, clock=FakeClock(), window_start=10**9)
    causes = CompileCauses(session)
    causes.start()

    def f(x: torch.Tensor, n: int) -> torch.Tensor:
        y = x.sin()
        if y.sum() > 0:  # a graph break
            y = y + 1
        return y * n

    compiled = torch.compile(f, backend="eager", dynamic=False)
    for length in (4, 8):
        compiled(torch.ones(2, length), 2)
        causes.compiled(None)
    causes.stop()
    session.close()
    torch._dynamo.reset()
    assert causes.recompiles and "size mismatch" in causes.recompiles[0]["reason"]
    assert causes.recompiles[0]["function"] == "f"
    [(_reason, file, line)] = list(causes.breaks)
    assert file == __file__ and line == f.__code__.co_firstlineno + 2
    assert "Graph break" not in capsys.readouterr().err  # nothing said on the job's output
    assert [(lg.level, lg.propagate, list(lg.handlers)) for lg in loggers] == before


def test_older_guard_failures_without_ids_are_the_compiling_frames(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def forward() -> None: ...

    failures: dict = {forward.__code__: []}
    monkeypatch.setitem(sys.modules, "torch._dynamo.guards",
                        SimpleNamespace(guard_failures=failures))
    session = Session(tmp_path, clock=FakeClock(), window_start=10**9)
    causes = CompileCauses(session)
    causes.start()
    failures[forward.__code__].append(["L['x'].size()[1] == 16", "L['n'] == 2"])  # torch 2.0
    causes.compiled(compile_key(4, 1))
    failures[forward.__code__].append("tensor 'L['x']' dtype mismatch. expected Float")
    causes.compiled(compile_key(4, 2))
    causes.stop()
    session.close()
    assert [(r["frame"], r["nth"], r["reason"], r["function"]) for r in causes.recompiles] == [
        (4, 1, "L['x'].size()[1] == 16", "forward"),
        (4, 2, "tensor 'L['x']' dtype mismatch. expected Float", "forward")]


def test_a_torch_without_these_records_says_nothing(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch._dynamo.guards", SimpleNamespace())
    session = Session(tmp_path, clock=FakeClock(), window_start=10**9)
    causes = CompileCauses(session)
    causes.start()
    causes.compiled(7)
    causes.saw_break("no place named here")
    causes.stop()
    session.close()
    assert not causes.recompiles and not causes.breaks
    assert "compile" not in session.probe_status  # no failure said either
