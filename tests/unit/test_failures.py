"""A process of the job killed by a signal is named first, with the signal and (where the
kernel's count says so) the OOM killer; its peers' broken connections follow from it
(doctor.probes.exits, doctor.analyse.failures)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from doctor.probes.exits import decode, read_exit, read_oom_kills


def test_a_wait_status_decodes_to_the_signal_or_the_exit_status() -> None:
    killed = decode(5, 1, signal.SIGKILL, 2.0, oom_killer=True)
    assert killed is not None and killed.signal_name == "SIGKILL" and killed.oom_killer
    assert decode(5, 1, signal.SIGSEGV | 0x80, 2.0, None).core_dumped  # type: ignore[union-attr]
    assert decode(5, 1, 3 << 8, 2.0, None).exit_status == 3  # type: ignore[union-attr]
    assert decode(5, 1, 0, 2.0, None) is None  # a clean exit is not a failure
    term = decode(5, 1, signal.SIGTERM, 2.0, oom_killer=True)
    assert term is not None and term.oom_killer is None  # the OOM killer sends SIGKILL only


def test_a_zombie_stat_gives_its_wait_status(tmp_path: Path) -> None:
    rest = " ".join(["0"] * 47)  # fields 5-51
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "stat").write_text(f"7 (a (b) c) Z 3 {rest} 9\n")  # field 52: 9
    assert read_exit(7, tmp_path) == (9, 3)
    (tmp_path / "8").mkdir()
    (tmp_path / "8" / "stat").write_text(f"8 (python) S 3 {rest} 0\n")
    assert read_exit(8, tmp_path) is None  # alive: no status yet
    assert read_exit(9, tmp_path) is None


def test_the_oom_kill_count_is_read_from_a_cgroup_or_vmstat(tmp_path: Path) -> None:
    events = tmp_path / "memory.events"
    events.write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\noom_group_kill 0\n")
    assert read_oom_kills(events) == 2
    assert read_oom_kills(tmp_path / "none") is None


def test_odd_deaths_in_run_json_are_left_out(tmp_path: Path) -> None:
    from doctor.analyse.failures import failure_notes
    from doctor.store.reader import load_run

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({
        "schema": "doctor.run/2", "argv": ["python", "x.py"], "exit_code": 1,
        "t0_monotonic_s": 1.0,
        "deaths": [{"pid": "x", "signal": 9}, {"pid": 5, "signal": "KILL"}, "text",
                   {"pid": 6, "signal": 9, "t_s": "soon", "oom_killer": "yes"}]}))
    notes = failure_notes(load_run([run_dir]))
    assert notes == ["Process 6 of the job was killed by SIGKILL; it failed first: the other "
                     "processes' errors follow from it (a peer's connection reset or closed, a "
                     "DataLoader worker that exited unexpectedly)."]


def _run_dir(tmp_path: Path, exit_code: int, deaths: list[dict[str, object]],
             metas: dict[str, dict[str, object]]) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({
        "schema": "doctor.run/2", "argv": ["torchrun", "x.py"], "exit_code": exit_code,
        "t0_monotonic_s": 1.0, "deaths": deaths}))
    for folder, meta in metas.items():
        (run_dir / folder).mkdir(parents=True)
        (run_dir / folder / "meta.json").write_text(json.dumps(meta))
    return run_dir


def test_a_helper_the_job_stopped_itself_is_no_failure(tmp_path: Path) -> None:
    from doctor.analyse.failures import failure_finding, failure_notes
    from doctor.store.reader import load_run

    run_dir = _run_dir(tmp_path, 0, [{"pid": 300, "ppid": 100, "signal": 9, "t_s": 5.0},
                                     {"pid": 301, "ppid": 100, "signal": 15, "t_s": 6.0}],
                       {"rank-0/main-100": {"pid": 100, "rank": 0, "role": "main",
                                            "ended_ns": 9}})
    run = load_run([run_dir])
    assert failure_notes(run) == [] and failure_finding(run) is None


def test_a_pool_worker_the_job_terminated_is_no_failure_of_a_job_that_exited_1(
        tmp_path: Path) -> None:
    """``with Pool(2)`` ends with ``terminate()``: its forked workers (recorded as the rank's
    children) die of SIGTERM. A job that then exits 1 on its own did not fail of them; a child
    killed by SIGKILL still is named."""
    from doctor.analyse.failures import failure_finding, failure_notes
    from doctor.store.reader import load_run

    metas = {"rank-0/main-100": {"pid": 100, "rank": 0, "role": "main", "ended_ns": 9},
             "rank-0/child-300": {"pid": 300, "rank": 0, "role": "child", "ended_ns": 5},
             "rank-0/child-301": {"pid": 301, "rank": 0, "role": "child", "ended_ns": 5}}
    stopped = [{"pid": 300, "ppid": 100, "signal": 15, "t_s": 5.0},
               {"pid": 301, "ppid": 100, "signal": 15, "t_s": 5.0}]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    run = load_run([_run_dir(tmp_path / "a", 1, stopped, metas)])
    assert failure_notes(run) == [] and failure_finding(run) is None
    killed = [{**stopped[0], "signal": 9}, stopped[1]]
    run = load_run([_run_dir(tmp_path / "b", 1, killed, metas)])
    finding = failure_finding(run)
    assert finding is not None and finding.evidence["pid"] == 300
    assert not any("301" in n for n in failure_notes(run))


def test_a_lone_process_that_exited_with_a_status_was_not_killed(tmp_path: Path) -> None:
    """One training process, no exit record (os._exit, or an exec into a shell), the job's
    exit status 7, no signal: it ended itself, no "killed" critical."""
    from doctor.analyse.failures import failure_finding, failure_notes
    from doctor.store.reader import load_run

    run = load_run([_run_dir(tmp_path, 7, [], {"rank-0/main-100": {"pid": 100, "rank": 0,
                                                                   "role": "main"}})])
    assert failure_notes(run) == [] and failure_finding(run) is None


def test_a_rank_that_left_no_exit_record_is_named_where_its_signal_was_missed(
        tmp_path: Path) -> None:
    from doctor.analyse.failures import failure_notes
    from doctor.store.reader import load_run

    run_dir = _run_dir(tmp_path, 1, [], {
        "rank-0/main-100": {"pid": 100, "rank": 0, "role": "main", "ended_ns": 9},
        "rank-1/main-101": {"pid": 101, "rank": 1, "role": "main"}})
    notes = failure_notes(load_run([run_dir]))
    assert notes[0].startswith("Rank 1 ended without a clean exit and without a Python "
                               "exception: it was killed")


def test_a_worker_reaped_before_the_parent_read_it_is_named_from_torchs_error(
        tmp_path: Path) -> None:
    """The training process reaps its DataLoader workers within milliseconds: where the parent
    lost that race, torch's own error names the worker's pid and signal."""
    from doctor.analyse.failures import failure_finding, failure_notes
    from doctor.store.reader import load_run

    crashed = ("RuntimeError: DataLoader worker (pid 102) is killed by signal: Killed. ")
    run_dir = _run_dir(tmp_path, 1, [], {
        "rank-0/main-100": {"pid": 100, "rank": 0, "role": "main", "crashed": crashed,
                            "crashed_ns": 5},
        "rank-0/worker1-102": {"pid": 102, "rank": 0, "role": "worker1"}})
    run = load_run([run_dir])
    finding = failure_finding(run)
    assert finding is not None and finding.evidence["signal"] == "SIGKILL"
    assert finding.evidence["role"] == "worker1"
    notes = failure_notes(run)
    assert notes[0].startswith("DataLoader worker 1 of rank 0 (pid 102) was killed by SIGKILL")


def test_a_worker_reaped_before_the_parent_read_it_is_named_from_the_exceptions_frames(
        tmp_path: Path) -> None:
    """torch's other error, "DataLoader worker (pid(s) 102) exited unexpectedly", names no
    signal: the training process read it from the worker's Process object as the exception
    went by (meta.json ``crashed_children``)."""
    from doctor.analyse.failures import failure_finding, failure_notes
    from doctor.store.reader import load_run

    crashed = "RuntimeError: DataLoader worker (pid(s) 102) exited unexpectedly"
    run_dir = _run_dir(tmp_path, 1, [], {
        "rank-0/main-100": {"pid": 100, "rank": 0, "role": "main", "crashed": crashed,
                            "crashed_ns": 5, "crashed_children": [
                                {"pid": 102, "signal": 9}, {"pid": "x", "signal": 9},
                                {"pid": 103, "signal": 400}, "odd"]},
        "rank-0/worker1-102": {"pid": 102, "rank": 0, "role": "worker1"}})
    run = load_run([run_dir])
    finding = failure_finding(run)
    assert finding is not None and finding.evidence["signal"] == "SIGKILL"
    assert finding.evidence["role"] == "worker1"
    notes = failure_notes(run)
    assert notes[0].startswith("DataLoader worker 1 of rank 0 (pid 102) was killed by SIGKILL")
    assert notes[1].startswith("Rank 0 failed (after DataLoader worker 1")
    assert not any("103" in n for n in notes)


def test_the_exceptions_frames_give_the_children_a_signal_killed() -> None:
    """The Process objects an exception's frames hold (a local list, as torch's
    ``failed_workers``, or a frame's ``self._workers``), each ended by its signal; a child that
    exited with a status, or still runs, is not one."""
    import multiprocessing
    import time

    from doctor.record.killed_children import killed_children

    ctx = multiprocessing.get_context("fork")
    killed, exited, running = (ctx.Process(target=time.sleep, args=(30,)),
                               ctx.Process(target=exit, args=(3,)),
                               ctx.Process(target=time.sleep, args=(30,)))
    for p in (killed, exited, running):
        p.start()
    try:
        assert killed.pid is not None
        os.kill(killed.pid, signal.SIGKILL)
        killed.join()
        exited.join()

        class Iterator:
            def __init__(self) -> None:
                self._workers = [exited, running]

            def fail(self) -> None:
                failed_workers = [killed]
                raise RuntimeError(f"DataLoader worker (pid(s) {failed_workers[0].pid}) "
                                   "exited unexpectedly")

        try:
            Iterator().fail()
        except RuntimeError as exc:
            found = killed_children(exc)
        assert found == [{"pid": killed.pid, "signal": signal.SIGKILL}]
        assert running.is_alive()  # looked at, never waited on
        assert killed_children(None) == []
    finally:
        running.kill()
        running.join()
