"""Several nodes, one run directory: which node a doctor run is (doctor.nodes), the node folders
and the claim of the one node that merges them (doctor.store), and the doors on such a folder
(doctor run, report, try). Recorded loops on fake clocks and plain-Python jobs; no torch job.

The tests here start jobs, processes or real clocks (tests/e2e); the pure ones are in
tests/unit/test_nodes.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from doctor.store import layout
from tests import chrome_trace
from tests.support import doctor_cmd, fake_node, record_node


def test_report_on_a_job_directory_is_the_whole_job(tmp_path: Path) -> None:
    job = tmp_path / "doctor-runs" / "job"
    record_node(job, 0)
    record_node(job, 1, t0_s=5000.0)
    as_html = doctor_cmd("report", str(job))
    assert as_html.returncode == 0, as_html.stderr
    assert as_html.stdout.strip() == str(job / layout.REPORT)
    assert (job / layout.REPORT).read_text().startswith("<!DOCTYPE html>")
    newest = doctor_cmd("report", "--format", "json", cwd=tmp_path)
    assert newest.returncode == 0, newest.stderr
    verdict = json.loads(newest.stdout)
    assert verdict["job"]["ranks"] == 2
    assert not [n for n in verdict["notes"] if "node-" in n]


def test_report_on_a_job_directory_with_nodes_missing_says_which(tmp_path: Path) -> None:
    record_node(tmp_path, 1, nnodes=3)
    record_node(tmp_path, 2, nnodes=3, ended=False, done=False)
    run = doctor_cmd("report", str(tmp_path), "--format", "json")
    assert run.returncode == 0, run.stderr
    verdict = json.loads(run.stdout)
    assert verdict["job"]["ranks"] == 2
    notes = [n for n in verdict["notes"] if "node-" in n]
    assert notes == [f"Node folders missing from {tmp_path}: node-0; this report has 2 of the "
                     "job's 3 nodes.",
                     "Unfinished node folders (their job had not ended when this report was "
                     "made): node-2."]


def test_try_on_a_job_directory_is_refused_in_one_line(tmp_path: Path) -> None:
    fake_node(tmp_path, 0)
    fake_node(tmp_path, 1)
    run = doctor_cmd("try", str(tmp_path), "--dry-run")
    assert run.returncode == 2
    assert run.stderr.startswith(f"doctor: {tmp_path} holds the nodes of a multi-node job")
    assert "one node's folder" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


def test_a_node_without_out_is_refused_before_the_job_starts(tmp_path: Path) -> None:
    job = tmp_path / "job.py"
    job.write_text("open('ran', 'w')\n")
    run = doctor_cmd("run", "python", str(job), cwd=tmp_path,
                     env={"DOCTOR_NODE_RANK": "1", "DOCTOR_NNODES": "2"})
    assert run.returncode == 2
    assert run.stderr.startswith("doctor: this is node 1 of a 2-node job: give every node's "
                                 "doctor run the same --out DIR on a shared filesystem")
    assert len(run.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "ran").exists() and not (tmp_path / "doctor-runs").exists()


def test_two_nodes_one_directory_one_merged_verdict(tmp_path: Path) -> None:
    """Each node's doctor run records into DIR/node-K; the second to finish merges."""
    job = tmp_path / "job.py"
    job.write_text("print('ok')\n")
    out = tmp_path / "out"
    runs = [doctor_cmd("run", "--out", str(out), "python", str(job),
                       env={"DOCTOR_NODE_RANK": str(k), "DOCTOR_NNODES": "2"})
            for k in (0, 1)]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr + runs[1].stderr
    assert [r.stdout for r in runs] == ["ok\n", "ok\n"]
    for k in (0, 1):
        node = out / f"node-{k}"
        assert (node / layout.RUN_RECORD).is_file() and (node / layout.VERDICT).is_file()
        assert (node / layout.REPORT).is_file()
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "node-0", "node-1", layout.NODES_RECORD, layout.REPORT, layout.TIMELINE, layout.VERDICT]
    chrome_trace.check_run_timeline(out)  # the job's timeline, from both nodes
    first, last = runs[0].stderr, runs[1].stderr
    assert f"Report: {out / 'node-0' / layout.REPORT}" in first
    assert (f"doctor: node 0 of 2 is done; node 1 still running: the last node to finish "
            f"writes the job's merged report into {out}") in first
    assert f"Report: {out / layout.REPORT}" in last
    assert f"node 1's own report is {out / 'node-1' / layout.REPORT}" in last
    assert json.loads((out / layout.VERDICT).read_text())["job"]["argv"][0] == "python"
