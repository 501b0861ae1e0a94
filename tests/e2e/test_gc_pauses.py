"""The garbage collector's pauses under ``doctor run`` (issue 34, item 2): a job whose steps keep
cyclic records beside a large heap of Python objects pauses in full collections; its slow steps
get the GC cause and the gc.freeze fix, and the collections doctor counted are the job's own.

The pure tests are in tests/unit/test_gc_probe.py and tests/unit/test_slow_step_causes.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.support import SAMPLE_JOBS, doctor_cmd

pytestmark = pytest.mark.e2e


def test_the_slow_steps_of_full_collections_get_the_gc_cause(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = doctor_cmd("run", "--out", str(out), "--", sys.executable,
                        str(SAMPLE_JOBS / "gc_pauses.py"), "--steps", "80", "--docs", "300000",
                        timeout=300, env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    [job] = [json.loads(line) for line in result.stdout.splitlines()
             if line.startswith('{"median_step_s"')]
    assert job["gc_full"] >= 2, job  # the job's own gc.callbacks saw full collections
    verdict = json.loads((out / "verdict.json").read_text())
    groups = {g["cause"]: g for g in verdict["slow_steps"]["groups"]}
    assert "gc" in groups and groups["gc"]["steps"] >= 1, verdict["slow_steps"]
    slow = [s for s in verdict["slow_steps"]["steps"] if s["cause"] == "gc"]
    assert all(any("generation 2" in w for w in s["what"]) for s in slow), slow
    [finding] = [f for f in verdict["findings"] if f["id"] == "steps.gc"]
    assert "gc.freeze()" in finding["fixes"][0]["code"]
    assert finding["estimated_speedup"] > 1.0
    [gc] = verdict["gc"]
    # doctor counts from torch's import to the process's exit, the job over its loop only
    assert gc["full"] >= job["gc_full"] and gc["written_full"] >= job["gc_full"]
    text = doctor_cmd("report", str(out), "--format", "text")
    assert "slow steps, Python's garbage collector" in text.stdout
