"""The store: a run directory read into RunData, several nodes combined, the control file."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from doctor.errors import RunFormatError
from doctor.store.control import post_stacks_mode, post_window, read_control
from doctor.store.reader import load_run
from doctor.store.rundata import FRAME_COLUMNS, combine
from tests.support import record_loop, write_record


def test_a_run_directory_reads_into_typed_frames(tmp_path: Path) -> None:
    session = record_loop(tmp_path, 12, wait_s=0.01, compute_s=0.02)
    write_record(tmp_path, cores=4)
    run = load_run(tmp_path)
    for name, columns in FRAME_COLUMNS.items():
        frame = run.frames[name]
        assert list(frame.columns) == list(columns), name
    assert run.record.argv == ("python", "train.py") and run.record.cores == 4
    assert list(run.processes["pid"]) == [session.pid]
    waits = run.intervals[run.intervals["name"] == "loader_wait"]
    assert len(waits) == 12 and (waits["t1_ns"] > waits["t0_ns"]).all()
    assert run.loaders["num_workers"].tolist() == [0]
    assert run.host.empty and run.window.empty  # nothing sampled, no window: empty, typed


def test_an_empty_run_directory_has_every_frame_empty_and_typed(tmp_path: Path) -> None:
    write_record(tmp_path)
    run = load_run(tmp_path)
    assert all(frame.empty for frame in run.frames.values())
    assert set(run.frames) == set(FRAME_COLUMNS)


def test_nodes_combine_into_one_run(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    record_loop(a, 5, rank=0)
    record_loop(b, 5, rank=1)
    write_record(a, host="node-a")
    write_record(b, exit_code=3, host="node-b", t0_monotonic_s=7.0)
    run = combine([load_run(a), load_run(b)])
    assert sorted(set(run.processes["node"])) == [0, 1]
    assert run.record.exit_code == 3  # the first failure speaks for the job
    assert run.record.nodes == ("node-a", "node-b")
    assert run.record.t0_ns == {0: 1000 * 10**9, 1: 7 * 10**9}
    assert set(run.intervals["node"]) == {0, 1}


def test_a_damaged_ring_is_left_out_and_said(tmp_path: Path) -> None:
    """A process killed as it made a ring leaves a file without a header: the rest is read."""
    from doctor.pipeline import analyze_run

    session = record_loop(tmp_path, 30, wait_s=0.001, compute_s=0.02)
    write_record(tmp_path)
    (session.directory / "backward.ring").write_bytes(b"")
    run = load_run(tmp_path)
    assert (run.intervals["name"] == "backward").sum() == 0
    assert (run.intervals["name"] == "optimizer").sum() == 30
    [problem] = run.record.problems
    assert "backward.ring: too short for a ring header: left out" in problem
    verdict = analyze_run(tmp_path).verdict
    assert verdict.bottleneck == "compute" and verdict.partial
    assert any(n.startswith("Not read: ") and "backward.ring" in n for n in verdict.notes)


def test_formats_this_doctor_reads_and_refuses(tmp_path: Path) -> None:
    record_loop(tmp_path, 5)
    write_record(tmp_path)
    record = json.loads((tmp_path / "run.json").read_text())
    (tmp_path / "run.json").write_text(json.dumps({**record, "schema": "doctor.run/1"}))
    assert len(load_run(tmp_path).processes) == 1  # the previous format reads as it is
    (tmp_path / "run.json").write_text(json.dumps({**record, "schema": "doctor.run/7"}))
    with pytest.raises(RunFormatError, match=r"format doctor\.run/7"):
        load_run(tmp_path)


def _post_windows(run_dir: Path, rank: int) -> None:
    for pid in range(200):
        post_window(run_dir, rank, pid, "active")


def test_the_control_file_takes_signals_from_many_processes_at_once(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    writers = [ctx.Process(target=_post_windows, args=(tmp_path, rank)) for rank in range(4)]
    for w in writers:
        w.start()
    post_stacks_mode(tmp_path, "in-process", "ptrace refused")
    for w in writers:
        w.join()
    post_window(tmp_path, 2, 7, "done")
    control = read_control(tmp_path)
    assert len(control.windows) == 4 * 200  # no line lost or torn
    assert control.windows[(2, 7)] == "done"  # the last word on a key wins
    assert len(control.open_windows()) == 800
    assert (control.stacks_mode, control.stacks_reason) == ("in-process", "ptrace refused")
    assert read_control(tmp_path / "none").stacks_mode is None


def test_typed_frames_fill_what_a_row_lacks() -> None:
    from doctor.store.rundata import columns, typed

    frame = typed([{"ok": True, "n": 3}, {"reason": "x"}],
                  columns("ok:bool n:float64 reason:object"))
    assert frame["ok"].tolist() == [True, False]  # a missing flag is False, never NaN-True
    assert frame["n"].isna().tolist() == [False, True]
    assert frame["reason"].tolist() == [None, "x"]


def test_the_jobs_world_size_from_its_processes(tmp_path: Path) -> None:
    from doctor.store.layout import process_dir
    from doctor.store.reader import job_world_size

    assert job_world_size(tmp_path) == 1  # no process recorded anything
    one = process_dir(tmp_path, 0, "main", 11)
    one.mkdir(parents=True)
    (one / "meta.json").write_text(json.dumps({"rank": 0, "world_size": None}))
    assert job_world_size(tmp_path) == 1
    (one / "meta.json").write_text(json.dumps({"rank": 0, "world_size": 4}))
    assert job_world_size(tmp_path) == 4  # node 0 of a job whose other ranks are elsewhere
    process_dir(tmp_path, 5, "main", 12).mkdir(parents=True)
    assert job_world_size(tmp_path) == 6  # a rank folder past what the meta said
