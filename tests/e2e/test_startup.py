"""Start-up that costs what the command needs: each command, run in a fresh interpreter, imports
only what it uses. The HTML report's libraries (matplotlib for its charts, jinja2 for its page)
load only when HTML is rendered, torch never loads on the analysis or report path, and ``doctor
run`` starts the job before it has loaded pandas.

Each case runs the CLI in a subprocess that writes the names in ``sys.modules`` to a file once
the command has finished, so what a test sees is exactly what that command imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import record_loop, write_record

HTML_ONLY = ("matplotlib", "jinja2", "markupsafe")
NEVER_ON_REPORT_PATH = ("torch",)
STEP_US = 10_000.0

#: Runs doctor's CLI with sys.argv[2:], then writes the top-level modules it imported to the file
#: sys.argv[1]; with --stub-job, ``doctor run`` writes them where the job would start, instead.
RECORD_MODULES = """
import json, sys
modules_file, args = sys.argv[1], sys.argv[2:]

def write_modules():
    with open(modules_file, "w") as f:
        json.dump(sorted({name.split(".")[0] for name in sys.modules}), f)

stub_job = args[0] == "--stub-job"
if stub_job:
    import os
    import doctor.launch

    def job_would_start(*_args, **_kwargs):
        write_modules()
        os._exit(0)

    doctor.launch.run_job = job_would_start
from doctor.cli import main
sys.argv = ["doctor", *args[stub_job:]]
try:
    main()
except SystemExit as stop:
    if stop.code:
        raise
if stub_job:
    sys.exit("doctor run ended without starting the job")
write_modules()
"""


def imported_by(tmp_path: Path, *args: str) -> set[str]:
    """The top-level modules that ``doctor ARGS`` imported, in a fresh interpreter."""
    modules_file = tmp_path / "modules.json"
    modules_file.unlink(missing_ok=True)
    done = subprocess.run([sys.executable, "-c", RECORD_MODULES, str(modules_file), *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    modules: list[str] = json.loads(modules_file.read_text())
    return set(modules)


def _event(cat: str, name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    gpu = cat in ("kernel", "gpu_memcpy")
    return {"ph": "X", "cat": cat, "name": name, "pid": 0 if gpu else 1, "tid": 7 if gpu else 1,
            "ts": ts, "dur": dur, "args": args}


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small GPU trace: each 10 ms step a kernel, then a host-to-device copy (something for
    the HTML report's charts to draw)."""
    events = []
    for i in range(6):
        t = i * STEP_US
        events += [_event("user_annotation", f"ProfilerStep#{i + 1}", t, STEP_US),
                   _event("kernel", "volta_sgemm_128x64_nn", t, 0.6 * STEP_US),
                   _event("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", t + 0.6 * STEP_US,
                          0.25 * STEP_US, bytes=1 << 24)]
    path = tmp_path_factory.mktemp("trace") / "rank0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory recorded without running a job (a real Session on a fake clock)."""
    path = tmp_path_factory.mktemp("run") / "run"
    record_loop(path, 40, wait_s=0.002, compute_s=0.01)
    write_record(path)
    return path


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_a_trace_reported_as_json_or_text_loads_no_html_library(
        tmp_path: Path, trace: Path, fmt: str) -> None:
    modules = imported_by(tmp_path, "report", str(trace), "--format", fmt)
    assert "pandas" in modules  # the analysis ran
    assert modules.isdisjoint(HTML_ONLY + NEVER_ON_REPORT_PATH), sorted(
        modules.intersection(HTML_ONLY + NEVER_ON_REPORT_PATH))


def test_a_trace_reported_as_html_loads_its_charts_and_template(tmp_path: Path,
                                                                 trace: Path) -> None:
    report = tmp_path / "report.html"
    modules = imported_by(tmp_path, "report", str(trace), "--format", "html", "-o", str(report))
    assert report.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert {"matplotlib", "jinja2"} <= modules
    assert "torch" not in modules


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_a_run_reported_as_json_or_text_loads_no_html_library(
        tmp_path: Path, run_dir: Path, fmt: str) -> None:
    modules = imported_by(tmp_path, "report", str(run_dir), "--format", fmt)
    assert "pandas" in modules
    assert modules.isdisjoint(HTML_ONLY + NEVER_ON_REPORT_PATH), sorted(
        modules.intersection(HTML_ONLY + NEVER_ON_REPORT_PATH))


def test_export_writes_the_timeline_without_the_html_libraries(tmp_path: Path,
                                                                run_dir: Path) -> None:
    timeline = tmp_path / "timeline.json.gz"
    modules = imported_by(tmp_path, "export", str(run_dir), "-o", str(timeline))
    assert timeline.stat().st_size > 0
    assert modules.isdisjoint(HTML_ONLY + NEVER_ON_REPORT_PATH), sorted(
        modules.intersection(HTML_ONLY + NEVER_ON_REPORT_PATH))


def test_compare_as_text_loads_no_html_library(tmp_path: Path, run_dir: Path) -> None:
    modules = imported_by(tmp_path, "compare", str(run_dir), str(run_dir), "--format", "text")
    assert modules.isdisjoint(HTML_ONLY + NEVER_ON_REPORT_PATH), sorted(
        modules.intersection(HTML_ONLY + NEVER_ON_REPORT_PATH))


def test_run_starts_the_job_before_loading_the_analysis_or_report_libraries(
        tmp_path: Path) -> None:
    modules = imported_by(tmp_path, "--stub-job", "run", "--out", str(tmp_path / "run"),
                          "--", sys.executable, "-c", "pass")
    assert "doctor" in modules
    assert modules.isdisjoint((*HTML_ONLY, "pandas", "torch")), sorted(
        modules.intersection((*HTML_ONLY, "pandas", "torch")))
