"""The report's modules are imported while the job starts (doctor.report_warmup): the names are
the report's, a failure stops the thread quietly and is left to the report, and the thread's CPU
is counted apart (tests/e2e/test_e2e.py: run.json's sampler_cpu_s)."""

from __future__ import annotations

import ast
import importlib
import sys
import types
from pathlib import Path

import doctor.run_summary
from doctor.report_warmup import REPORT_MODULES, ReportWarmup


def test_every_module_named_is_one_the_report_imports_and_exists() -> None:
    for name in REPORT_MODULES:
        assert importlib.util.find_spec(name) is not None, name
    # what doctor.run_summary imports after the job is among them, or imported by them
    tree = ast.parse(Path(doctor.run_summary.__file__).read_text())
    lazy = {node.module for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef)
            for node in ast.walk(fn) if isinstance(node, ast.ImportFrom) and node.module}
    assert "doctor.outputs" in lazy and "doctor.reports.text" in lazy
    ReportWarmup().start().wait(60)
    assert lazy <= set(sys.modules)


def test_a_module_that_fails_stops_the_thread_and_is_named(monkeypatch) -> None:
    bad = types.ModuleType("doctor_warmup_bad")
    monkeypatch.setitem(sys.modules, "doctor_warmup_first", bad)
    warm = ReportWarmup(("doctor_warmup_first", "doctor_warmup_missing_module", "json"))
    assert warm.cpu_s() == 0.0  # not started
    warm.start()
    assert warm.wait(60)
    assert warm.failed == "doctor_warmup_missing_module"
    assert warm.cpu_s() >= 0.0

