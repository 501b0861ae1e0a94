"""A run directory is one run (issue 32): an --out holding an earlier run is refused in one line
(exit 2, naming --force), --force replaces it (never merged), two doctor runs into one directory
at once are refused by a lock that a dead run does not leave behind, a node of a multi-node job
claims its own folder only, and doctor.watch(out=...) keeps the same rule without stopping the
job. The jobs are plain Python, but for one small torch job run twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from doctor.errors import UsageError
from doctor.store import layout
from doctor.store.claim import claim_run_dir, earlier_run, release_run_dir, share_run_dir
from doctor.store.rundir import new_run_dir
from tests.support import doctor_cmd


def script(tmp_path: Path, body: str, name: str = "job.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def one_line_refusal(run: subprocess.CompletedProcess[str]) -> str:
    assert run.returncode == 2, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "Traceback" not in run.stderr
    return run.stderr.strip()


def old_run(run_dir: Path) -> None:
    """A run directory as an earlier run left it (its files, a process folder)."""
    (run_dir / "rank-0" / "main-123").mkdir(parents=True)
    (run_dir / "rank-0" / "main-123" / layout.META).write_text("{}")
    for name in (layout.RUN_RECORD, layout.VERDICT, layout.REPORT, layout.CONTROL):
        (run_dir / name).write_text("old")


def test_an_out_holding_a_run_is_refused_in_one_line(tmp_path: Path) -> None:
    job = script(tmp_path, "open('ran', 'w')\n")
    out = tmp_path / "runs" / "exp1"
    out.mkdir(parents=True)
    old_run(out)
    run = doctor_cmd("run", "--out", str(out), str(job), cwd=tmp_path)
    line = one_line_refusal(run)
    assert line.startswith(f"doctor: {out} holds an earlier run (")
    assert "give --force to replace it, or a new or empty directory" in line
    assert not (tmp_path / "ran").exists()  # refused before the job started
    assert (out / layout.RUN_RECORD).read_text() == "old"  # and nothing of it touched


def test_an_empty_or_new_out_is_fine_and_files_not_doctors_do_not_count(tmp_path: Path) -> None:
    job = script(tmp_path, "print('ok')\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's")
    for out in (empty, tmp_path / "new" / "deeper", mine):
        run = doctor_cmd("run", "-q", "--out", str(out), str(job))
        assert run.returncode == 0 and run.stdout == "ok\n", run.stderr
        assert (out / layout.VERDICT).is_file()
    assert (mine / "notes.txt").read_text() == "the user's"


def test_force_replaces_the_earlier_run_never_merged(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    old_run(out)
    (out / "notes.txt").write_text("the user's")
    (out / "tries" / "20260101-000000").mkdir(parents=True)
    job = script(tmp_path, "print('ok')\n")
    run = doctor_cmd("run", "-q", "--force", "--out", str(out), str(job))
    assert run.returncode == 0, run.stderr
    assert not (out / "rank-0").exists() and not (out / "tries").exists()
    assert json.loads((out / layout.RUN_RECORD).read_text())["exit_code"] == 0
    assert json.loads((out / layout.VERDICT).read_text())["job"]["exit_code"] == 0
    assert (out / "notes.txt").read_text() == "the user's"  # not doctor's: left alone


TORCH_JOB = """
import sys
import torch
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(int(sys.argv[1])):
    opt.zero_grad()
    model(torch.randn(8, 4)).sum().backward()
    opt.step()
"""


@pytest.mark.e2e
def test_a_reused_out_never_reports_the_old_job(tmp_path: Path) -> None:
    """The issue's case: --out runs/exp1 run twice. The second run (with --force) is reported
    alone: its own steps, its own process folder, never the first job's."""
    job = script(tmp_path, TORCH_JOB)
    out = tmp_path / "runs" / "exp1"
    first = doctor_cmd("run", "-q", "--window", "off", "--out", str(out), str(job), "30")
    assert first.returncode == 0, first.stderr[-2000:]
    [old] = [p for p, *_ in layout.process_dirs(out)]
    first_steps = json.loads((out / layout.VERDICT).read_text())["steps"]["count"]
    again = doctor_cmd("run", "-q", "--window", "off", "--out", str(out), str(job), "12")
    assert one_line_refusal(again).startswith(f"doctor: {out} holds an earlier run")
    forced = doctor_cmd("run", "-q", "--window", "off", "--force", "--out", str(out), str(job),
                        "12")
    assert forced.returncode == 0, forced.stderr[-2000:]
    [new] = [p for p, *_ in layout.process_dirs(out)]
    assert new != old and not old.exists()
    verdict = json.loads((out / layout.VERDICT).read_text())
    assert verdict["job"]["argv"][-1] == "12"
    assert verdict["steps"]["count"] == first_steps - 18  # 12 steps where there were 30


def test_a_second_run_into_a_directory_being_recorded_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "run"
    go = tmp_path / "go"
    job = script(tmp_path, f"""
        import os, time
        open({str(tmp_path / 'started')!r}, 'w').close()
        while not os.path.exists({str(go)!r}):
            time.sleep(0.05)
        print('first')
    """)
    first = subprocess.Popen([sys.executable, "-m", "doctor.cli", "run", "-q", "--out",
                              str(out), str(job)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "started").exists():
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "the first job never started"
            time.sleep(0.05)
        other = script(tmp_path, "open('ran', 'w')\n", "other.py")
        for force in ([], ["--force"]):  # --force does not take a directory from a live run
            second = doctor_cmd("run", *force, "--out", str(out), str(other), cwd=tmp_path)
            line = one_line_refusal(second)
            assert line == (f"doctor: another doctor run is recording into {out} now (pid "
                            f"{first.pid}): wait for it to end, or give another directory")
        assert not (tmp_path / "ran").exists()
    finally:
        go.touch()
        stdout, stderr = first.communicate(timeout=120)
    assert first.returncode == 0 and stdout == "first\n", stderr
    assert json.loads((out / layout.RUN_RECORD).read_text())["argv"][-1] == str(job)


def test_a_lock_left_by_a_dead_run_blocks_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    (out / layout.RUN_LOCK).write_text(f"{dead}\n")  # a run killed with SIGKILL leaves this
    assert earlier_run(out) == []
    run = doctor_cmd("run", "-q", "--out", str(out), str(script(tmp_path, "print('ok')\n")))
    assert run.returncode == 0 and run.stdout == "ok\n", run.stderr


def test_the_claim_in_process(tmp_path: Path) -> None:
    """new_run_dir takes the lock for this process until it is released; a second claim of the
    same directory by this process is the same claim."""
    run_dir = new_run_dir(tmp_path / "run", "job")
    try:
        claim_run_dir(run_dir)  # the same process: no refusal
        held = subprocess.run(
            [sys.executable, "-c", "import sys; from pathlib import Path; "
             "from doctor.store.rundir import new_run_dir; new_run_dir(Path(sys.argv[1]), 'x')",
             str(run_dir)], capture_output=True, text=True)
        assert held.returncode != 0 and "another doctor run is recording into" in held.stderr
    finally:
        release_run_dir(run_dir)
    (run_dir / layout.RUN_RECORD).write_text("{}")
    with pytest.raises(UsageError, match="holds an earlier run"):
        new_run_dir(run_dir, "job")
    assert new_run_dir(run_dir, "job", force=True) == run_dir
    release_run_dir(run_dir)
    assert not (run_dir / layout.RUN_RECORD).exists()


NODE = {"DOCTOR_NNODES": "2"}


def test_each_node_claims_its_own_folder_not_the_shared_directory(tmp_path: Path) -> None:
    job = script(tmp_path, "print('ok')\n")
    out = tmp_path / "job7"
    for k in (0, 1):
        run = doctor_cmd("run", "-q", "--out", str(out), str(job),
                         env={**NODE, "DOCTOR_NODE_RANK": str(k)})
        assert run.returncode == 0, run.stderr  # node 1 records beside node 0's folder
    assert (out / layout.VERDICT).is_file()  # the merged verdict
    again = doctor_cmd("run", "--out", str(out), str(job), env={**NODE, "DOCTOR_NODE_RANK": "0"})
    assert one_line_refusal(again).startswith(f"doctor: {out / 'node-0'} holds an earlier run")
    record = json.loads((out / "node-1" / layout.RUN_RECORD).read_text())
    record["started"] = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(time.time() - 3600))
    (out / "node-1" / layout.RUN_RECORD).write_text(json.dumps(record))  # the job of an hour ago
    node1 = (out / "node-1" / layout.RUN_RECORD).read_text()
    forced = doctor_cmd("run", "--force", "--out", str(out), str(job),
                        env={**NODE, "DOCTOR_NODE_RANK": "0"})
    assert forced.returncode == 0, forced.stderr
    # node 0 replaced its own folder, and node 1's is as it was; the earlier job's merged
    # outputs are gone, and node 1's earlier run is never merged with node 0's new one
    assert (out / "node-1" / layout.RUN_RECORD).read_text() == node1
    assert (out / "node-0" / layout.VERDICT).is_file()
    assert not (out / layout.VERDICT).exists() and not (out / layout.NODES_RECORD).exists()
    assert "doctor: node 0 of 2 is done; node 1 still running" in forced.stderr
    report = doctor_cmd("report", str(out), "--format", "text")
    assert report.returncode == 0, report.stderr
    assert "Node folders holding an earlier job's run" in " ".join(report.stdout.split())


def test_a_node_into_a_single_node_run_is_refused(tmp_path: Path) -> None:
    job = script(tmp_path, "print('ok')\n")
    out = tmp_path / "run"
    assert doctor_cmd("run", "-q", "--out", str(out), str(job)).returncode == 0
    run = doctor_cmd("run", "--out", str(out), str(job), env={**NODE, "DOCTOR_NODE_RANK": "1"})
    assert one_line_refusal(run) == (f"doctor: {out} holds a single-node run: give every node "
                                     "of this job another --out directory")


WATCHED = """
import sys
import doctor

@doctor.watch(out=sys.argv[1], window="off", force=sys.argv[2] == "force")
def train():
    return 42

print(train())
"""


def test_watch_keeps_the_rule_and_never_stops_the_job(tmp_path: Path) -> None:
    job = script(tmp_path, WATCHED)
    out = tmp_path / "run"
    out.mkdir()
    old_run(out)
    refused = subprocess.run([sys.executable, str(job), str(out), "no"], capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode == 0 and refused.stdout == "42\n", refused.stderr
    assert refused.stderr == (f"doctor: {out} holds an earlier run (control.jsonl, rank-0, "
                              "report.html, ...): give force=True to replace it, or a new or "
                              "empty directory; the job runs without doctor.watch\n")
    assert (out / layout.RUN_RECORD).read_text() == "old"
    forced = subprocess.run([sys.executable, str(job), str(out), "force"], capture_output=True,
                            text=True, timeout=180)
    assert forced.returncode == 0 and forced.stdout == "42\n", forced.stderr
    assert json.loads((out / layout.RUN_RECORD).read_text())["mode"] == "watch"
    assert not (out / "rank-0" / "main-123").exists()


def test_doctor_run_under_a_lock_of_watch_is_refused(tmp_path: Path) -> None:
    """The lock is the directory's, whichever door took it."""
    run_dir = new_run_dir(tmp_path / "run", "job")
    try:
        run = doctor_cmd("run", "--out", str(run_dir), str(script(tmp_path, "print(1)\n")))
        assert "another doctor run is recording into" in one_line_refusal(run)
        assert str(os.getpid()) in run.stderr
    finally:
        release_run_dir(run_dir)


CLAIM_IN_CHILD = ("import sys; from pathlib import Path; from doctor.store import claim; "
                  "getattr(claim, sys.argv[2])(Path(sys.argv[1]))")


def test_a_try_shares_the_lock_a_run_takes_alone(tmp_path: Path) -> None:
    """doctor try holds the run directory's lock shared while it re-runs the job: a second try
    may run beside it, a doctor run (--force included) into it is refused; and a try is refused
    while a run records there."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()

    def other(how: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", CLAIM_IN_CHILD, str(run_dir), how],
                              capture_output=True, text=True, timeout=60)

    share_run_dir(run_dir)
    try:
        assert other("share_run_dir").returncode == 0
        refused = other("claim_run_dir")
        assert refused.returncode != 0
        assert (f"a doctor try is re-running the run in {run_dir} now (pid " in refused.stderr)
    finally:
        release_run_dir(run_dir)
    claim_run_dir(run_dir)
    try:
        refused = other("share_run_dir")
        assert refused.returncode != 0 and "is recording into" in refused.stderr
    finally:
        release_run_dir(run_dir)
