"""torch.compile under ``doctor run`` (issue 35, item 3, in part): a compiled model that
recompiles for each new input length gets compile.recompiles with the recompilations Dynamo
made, its compile steps out of the shares; compiled with dynamic=True, it does not. The
recorded-loop tests are in tests/unit/test_compiles.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import run_sample_job

pytestmark = pytest.mark.e2e


def run_job(tmp_path: Path, *flags: str) -> tuple[dict, dict]:
    return run_sample_job(tmp_path / "run", "compile_recompiles.py", "--steps", "50",
                          "--backend", "aot_eager", *flags)


def test_recompiles_for_each_length_are_named(tmp_path: Path) -> None:
    job, verdict = run_job(tmp_path)
    found = {f["id"]: f for f in verdict["findings"]}
    rec = found["compile.recompiles"]
    assert rec["evidence"]["recompilations"] == job["lengths"] - 1
    # what doctor timed in compilations is within what the job timed in its first passes
    compiled_s = rec["evidence"]["first_compile_s"] + rec["evidence"]["recompile_s"]
    assert 0.5 * job["first_pass_s"] < compiled_s <= job["first_pass_s"]
    assert any("torch.compile compiled are left out" in n for n in verdict["notes"])


def test_dynamic_shapes_do_not_recompile(tmp_path: Path) -> None:
    _job, verdict = run_job(tmp_path, "--fixed")
    assert "compile.recompiles" not in {f["id"] for f in verdict["findings"]}
