"""CPU sample jobs built to be memory-bound and GEMM-bound under ``doctor run``: their ops come
out in those classes, against the roofline doctor measured on this machine."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.support import SAMPLE_JOBS, doctor_cmd

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("matmul", [False, True])
def test_elementwise_chain_is_memory_bound_and_dense_layers_compute_bound(
        tmp_path: Path, matmul: bool) -> None:
    out = tmp_path / "run"
    result = doctor_cmd("run", "--out", str(out), "--", sys.executable,
                        str(SAMPLE_JOBS / "elementwise_bound.py"), "--steps", "30",
                        *(["--matmul"] if matmul else []))
    assert result.returncode == 0, result.stderr
    verdict = json.loads((out / "verdict.json").read_text())
    [ops] = verdict["ops"]
    assert ops["roofs"]["source"] == "measured on this machine"
    share: dict[str, float] = {}
    for row in ops["top"]:
        if row["bound"]:
            share[row["bound"]] = share.get(row["bound"], 0.0) + row["share"]
    ids = [f["id"] for f in verdict["findings"]]
    said = result.stdout + result.stderr  # the terminal summary's line for the ops
    assert f"Ops, rank 0: {'compute' if matmul else 'memory'}-bound" in said
    if matmul:
        # most of the op time (it read 0.54-0.59 here while other work loaded the 2 cores)
        assert share.get("compute", 0.0) > 0.5 and "ops.memory_bound" not in ids
        assert ops["mfu"] > 5 * 0.02  # dense layers use the machine, the chain barely
    else:
        assert share.get("memory", 0.0) > 0.5 and "ops.memory_bound" in ids
        assert ops["mfu"] < 0.1


def test_window_without_shapes_keeps_ops_by_time_and_says_why(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = doctor_cmd("run", "--out", str(out), "--", sys.executable,
                        str(SAMPLE_JOBS / "elementwise_bound.py"), "--steps", "30",
                        env={"DOCTOR_SHAPES": "off"})
    assert result.returncode == 0, result.stderr
    verdict = json.loads((out / "verdict.json").read_text())
    [ops] = verdict["ops"]
    assert ops["top"] and all(row["flops"] is None or row["flops"] != row["flops"] or
                              row["flops"] == 0 for row in ops["top"])
    assert "DOCTOR_SHAPES=off" in ops["note"]
    assert ops["mfu"] is None
    ids = [f["id"] for f in verdict["findings"]]
    assert "ops.memory_bound" not in ids
    report = out / "report.html"
    assert "DOCTOR_SHAPES=off" in report.read_text()
