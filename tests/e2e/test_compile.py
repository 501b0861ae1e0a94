"""torch.compile under ``doctor run`` (issue 35, item 3): a compiled model that recompiles for
each new input length gets compile.recompiles with the recompilations Dynamo made and their
cause (the input's size) and fix, its compile steps out of the shares; compiled with
dynamic=True, it does not; a data-dependent branch in its forward is named as a graph break at
the job's own line. The recorded-loop tests are in tests/unit/test_compiles.py and
tests/unit/test_compile_causes.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import SAMPLE_JOBS, run_sample_job

pytestmark = pytest.mark.e2e


def run_job(tmp_path: Path, *flags: str) -> tuple[dict, dict]:
    return run_sample_job(tmp_path / "run", "compile_recompiles.py", "--steps", "50",
                          "--backend", "aot_eager", *flags)


def test_recompiles_for_each_length_are_named(tmp_path: Path) -> None:
    job, verdict = run_job(tmp_path)
    found = {f["id"]: f for f in verdict["findings"]}
    rec = found["compile.recompiles"]
    assert rec["evidence"]["recompilations"] == job["recompiles"] == job["lengths"] - 1
    [cause] = rec["evidence"]["causes"]
    assert cause["kind"] == "size" and cause["recompilations"] == job["recompiles"]
    assert cause["where"].startswith(str(SAMPLE_JOBS / "compile_recompiles.py"))
    assert rec["fixes"][0]["code"].startswith("model = torch.compile(model, dynamic=True)")
    assert "compile.graph_breaks" not in found
    # what doctor timed in compilations is within what the job timed in its first passes
    compiled_s = rec["evidence"]["first_compile_s"] + rec["evidence"]["recompile_s"]
    assert 0.5 * job["first_pass_s"] < compiled_s <= job["first_pass_s"]
    assert any("torch.compile compiled are left out" in n for n in verdict["notes"])


def test_dynamic_shapes_do_not_recompile(tmp_path: Path) -> None:
    _job, verdict = run_job(tmp_path, "--fixed")
    assert "compile.recompiles" not in {f["id"] for f in verdict["findings"]}


def test_a_graph_break_is_named_at_the_jobs_line(tmp_path: Path) -> None:
    job, verdict = run_job(tmp_path, "--graph-break", "--fixed")
    found = {f["id"]: f for f in verdict["findings"]}
    [brk] = found["compile.graph_breaks"]["evidence"]["breaks"]
    assert brk["where"] == f"{SAMPLE_JOBS / 'compile_recompiles.py'}:{job['break_line']}"
    assert brk["reason"] and brk["times_met"] >= 1
