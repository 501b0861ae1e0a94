"""torch.compile under ``doctor run`` (issue 35, item 3): a compiled model that recompiles for
each new input length gets compile.recompiles with the recompilations Dynamo made and their
cause (the input's size) and fix, its compile steps out of the shares; compiled with
dynamic=True, it does not; a data-dependent branch in its forward is named as a graph break at
the job's own line; ``doctor try --set compile=off`` runs it uncompiled and measures it. The
recorded-loop tests are in tests/unit/test_compiles.py and
tests/unit/test_compile_causes.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support import SAMPLE_JOBS, doctor_cmd, run_sample_job

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


def settings_seen(folder: Path) -> dict[str, Any]:
    """What the job printed it runs with (its own view, not doctor's record)."""
    line = next(x for x in (folder / "stdout.txt").read_text().splitlines()
                if x.startswith('{"settings"'))
    return dict(json.loads(line)["settings"])


def test_compile_off_is_tried_uncompiled_and_measured(tmp_path: Path) -> None:
    run_job(tmp_path)
    run_dir = tmp_path / "run"
    verdict = json.loads((run_dir / "verdict.json").read_text())
    offered = [f["apply"] for finding in verdict["findings"] for f in finding["fixes"]
               if finding["id"].startswith("compile.") and f.get("apply")]
    assert {"torch": {"compile": "off"}} in offered  # the compile finding's fix can be tried
    tried = doctor_cmd("try", str(run_dir), "--yes", "--set", "compile=off", "--steps", "10",
                       "--repeat", "1", cwd=tmp_path, timeout=400, env={"OMP_NUM_THREADS": "1"})
    assert tried.returncode == 0, tried.stderr[-3000:] + tried.stdout[-2000:]
    record = json.loads(sorted(run_dir.glob("tries/*/try.json"))[-1].read_text())
    [c] = record["candidates"]
    assert c["apply"] == {"torch": {"compile": "off"}}
    assert c["outcome"] != "failed", c
    assert c["speedup"] is not None
    try_dir = run_dir / record["dir"].split(str(run_dir) + "/")[-1]
    assert settings_seen(try_dir / c["attempts"][0]) == {"compiled": False}
    assert settings_seen(try_dir / record["baseline"]["rounds"][0]["dir"]) == {"compiled": True}
    print(f"compile=off: {c['outcome']} {c['speedup']:.2f}x")
