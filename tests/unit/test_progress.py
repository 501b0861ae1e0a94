"""doctor run's progress lines: the start line from the parent's probes, and the deep window's
lines from a control file that the test writes as the job's processes would (post_window), ticked
by hand on a fake parent clock. Once for the job, never per step or per rank."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from doctor.progress import WindowProgress, process_windows, start_line
from doctor.store import layout
from doctor.store.control import post_window, read_control
from doctor.verdict import ProbeStatus

ON = ProbeStatus(True)
OFF = ProbeStatus(False, "NVML library not found")


class Job:
    """A fake job: its ranks' folders and the windows they post (each on its own clock)."""

    def __init__(self, run_dir: Path, ranks: int = 1) -> None:
        self.run_dir = run_dir
        for rank in range(ranks):
            self.folder(rank).mkdir(parents=True)

    def folder(self, rank: int) -> Path:
        return layout.process_dir(self.run_dir, rank, "main", self.pid(rank))

    @staticmethod
    def pid(rank: int) -> int:
        return 1000 + rank

    def post(self, rank: int, state: str, t_s: float, steps: int | None = 5) -> None:
        post_window(self.run_dir, rank, self.pid(rank), state, steps=steps, t_s=t_s)

    def fail(self, rank: int, t_s: float, reason: str | None) -> None:
        record = {"state": "failed", **({"reason": reason} if reason else {})}
        (self.folder(rank) / layout.META).write_text(json.dumps({"window": record}))
        post_window(self.run_dir, rank, self.pid(rank), "failed", t_s=t_s)


class Heard:
    """The lines said, and a parent clock that ticks the reporter every half second."""

    def __init__(self, run_dir: Path, grace_s: float = 2.0, stacks: bool = True) -> None:
        self.lines: list[str] = []
        self.now = 0.0
        self.progress = WindowProgress(run_dir, self.lines.append, stacks=lambda: stacks,
                                       grace_s=grace_s)

    def tick(self, times: int = 1) -> list[str]:
        """Tick ``times`` times; the lines said meanwhile."""
        before = len(self.lines)
        for _ in range(times):
            self.now += 0.5
            self.progress.tick(self.now)
        return self.lines[before:]


def test_start_line_says_what_runs_where_and_that_ctrl_c_keeps_a_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "doctor-runs" / "20260101-120000-input_bound"
    probes = {"host": ON, "gpu": OFF, "stacks": ON}
    assert start_line("input_bound", run_dir, probes, (8, 5)) == (
        "doctor: recording input_bound into doctor-runs/20260101-120000-input_bound (steps, "
        "DataLoader waits, CPU/IO samples, stack samples, torch.profiler at steps 8-12); "
        "Ctrl-C stops the job and still writes a partial report")
    on_gpu = start_line("train", Path("/elsewhere/run"),
                        {"host": ON, "gpu": ON, "stacks": ProbeStatus(
                            True, "in-process sampler (py-spy is not installed)")}, (20, 3))
    assert "into /elsewhere/run (" in on_gpu
    assert "CPU/IO samples, GPU samples, stack samples (in-process), torch.profiler at " \
           "steps 20-22)" in on_gpu
    # stacks are sampled while the window is open: none without it
    off = start_line("train", run_dir, {"host": OFF, "gpu": OFF, "stacks": ON}, (0, 0))
    assert "(steps, DataLoader waits, torch.profiler off);" in off
    assert "\n" not in off and "\x1b" not in start_line("a\x1b[31mb", run_dir, probes, (8, 5))


def test_one_rank_says_open_then_closed_and_nothing_per_step(tmp_path: Path) -> None:
    job, heard = Job(tmp_path), Heard(tmp_path)
    assert heard.tick(4) == []  # no window yet: nothing
    job.post(0, "active", t_s=100.0)
    assert heard.tick() == ["doctor: deep window open on rank 0 "
                            "(5 steps; torch.profiler and stack sampling)"]
    assert heard.tick(10) == []  # the window's steps go by: nothing
    job.post(0, "done", t_s=101.93)
    assert heard.tick() == ["doctor: deep window closed on rank 0: 5 steps in 1.9 s "
                            "(left out of the shares)"]
    assert heard.tick(10) == []
    heard.progress.finish()
    assert len(heard.lines) == 2


def test_a_window_a_fork_closed_says_the_steps_it_profiled(tmp_path: Path) -> None:
    """A fork inside the window closes it early (a child must not inherit a running profiler):
    the close line says so, with the steps profiled, not the steps planned."""
    job, heard = Job(tmp_path), Heard(tmp_path)
    job.post(0, "active", t_s=100.0)
    heard.tick()
    post_window(tmp_path, 0, job.pid(0), "done", steps=2, closed_by="fork", t_s=100.5)
    assert heard.tick() == ["doctor: deep window closed on rank 0 early, as the process forked: "
                            "2 steps in 0.5 s (left out of the shares)"]


def test_the_fork_name_is_the_probes() -> None:
    from doctor.probes import torch_ops
    from doctor.progress import BY_FORK

    assert BY_FORK == torch_ops.BY_FORK


def test_without_stack_sampling_the_open_line_says_torch_profiler_only(tmp_path: Path) -> None:
    job, heard = Job(tmp_path), Heard(tmp_path, stacks=False)
    job.post(0, "active", t_s=5.0, steps=3)
    assert heard.tick() == ["doctor: deep window open on rank 0 (3 steps; torch.profiler)"]


def test_a_window_seen_only_once_closed_says_both_lines(tmp_path: Path) -> None:
    job, heard = Job(tmp_path), Heard(tmp_path)
    job.post(0, "active", t_s=10.0)
    job.post(0, "done", t_s=10.42)  # between two ticks of a fast job
    assert heard.tick() == [
        "doctor: deep window open on rank 0 (5 steps; torch.profiler and stack sampling)",
        "doctor: deep window closed on rank 0: 5 steps in 0.4 s (left out of the shares)"]


def test_several_ranks_say_one_line_each_time_for_all_of_them(tmp_path: Path) -> None:
    job, heard = Job(tmp_path, ranks=4), Heard(tmp_path)
    job.post(0, "active", t_s=50.0)
    job.post(1, "active", t_s=50.1)
    assert heard.tick() == []  # ranks 2 and 3 have not opened theirs yet
    job.post(2, "active", t_s=50.0)
    job.post(3, "active", t_s=50.2)
    assert heard.tick() == ["doctor: deep window open on 4 ranks "
                            "(5 steps; torch.profiler and stack sampling)"]
    for rank, t_s in ((0, 51.9), (1, 52.0), (2, 52.3)):
        job.post(rank, "done", t_s=t_s)
    assert heard.tick() == []  # rank 3's window is still open
    job.post(3, "done", t_s=52.5)
    assert heard.tick() == ["doctor: deep window closed on 4 ranks: 5 steps in 1.9-2.3 s "
                            "(left out of the shares)"]
    assert heard.tick(6) == []


def test_a_rank_that_does_not_open_is_waited_for_only_so_long(tmp_path: Path) -> None:
    job, heard = Job(tmp_path, ranks=4), Heard(tmp_path, grace_s=2.0)
    for rank in (0, 1, 2):
        job.post(rank, "active", t_s=7.0)
    assert heard.tick(4) == []  # 0.5 .. 2.0 s after the first window was seen
    assert heard.tick() == ["doctor: deep window open on 3 of 4 ranks (0, 1, 2) "
                            "(5 steps; torch.profiler and stack sampling)"]


def test_a_window_that_fails_as_it_opens_says_why(tmp_path: Path) -> None:
    job, heard = Job(tmp_path), Heard(tmp_path)
    job.fail(0, t_s=3.0, reason="RuntimeError: profiler already\x1b[31m enabled\n on thread")
    assert heard.tick() == ["doctor: deep window failed on rank 0: RuntimeError: profiler "
                            "already [31m enabled on thread"]
    assert heard.tick(4) == []


def test_a_failure_without_a_reason_points_to_the_report(tmp_path: Path) -> None:
    job, heard = Job(tmp_path), Heard(tmp_path)
    job.post(0, "active", t_s=3.0)
    assert len(heard.tick()) == 1
    job.fail(0, t_s=3.5, reason=None)
    assert heard.tick() == ["doctor: deep window failed on rank 0 (the report says why)"]


def test_one_failed_rank_among_several_is_named_in_the_close_line(tmp_path: Path) -> None:
    job, heard = Job(tmp_path, ranks=4), Heard(tmp_path)
    for rank in range(4):
        job.post(rank, "active", t_s=20.0)
    assert len(heard.tick()) == 1
    for rank in (0, 1, 3):
        job.post(rank, "done", t_s=22.0)
    job.fail(2, t_s=21.0, reason="OSError: [Errno 28] No space left on device")
    assert heard.tick() == [
        "doctor: deep window closed on 3 of 4 ranks (0, 1, 3): 5 steps in 2.0 s (left out of "
        "the shares); failed on rank 2 of 4: OSError: [Errno 28] No space left on device"]


def test_a_window_the_job_ended_in_is_said_after_the_job(tmp_path: Path) -> None:
    job, heard = Job(tmp_path), Heard(tmp_path)
    job.post(0, "active", t_s=8.0)
    assert len(heard.tick()) == 1
    job.post(0, "done", t_s=8.6)  # closed at exit, after the last tick
    heard.progress.finish()
    assert heard.lines[1:] == ["doctor: deep window closed on rank 0 as the job ended: up to 5 "
                               "steps in 0.6 s (left out of the shares)"]
    heard.progress.finish()
    assert len(heard.lines) == 2


def test_a_window_still_open_when_the_job_was_killed(tmp_path: Path) -> None:
    job, heard = Job(tmp_path, ranks=2), Heard(tmp_path)
    job.post(0, "active", t_s=8.0)
    job.post(1, "active", t_s=8.0)
    heard.progress.finish()
    assert heard.lines == ["doctor: deep window still open on 2 ranks when the job ended "
                           "(the report says what it kept)"]


def test_process_windows_read_the_facts_of_each_state(tmp_path: Path) -> None:
    job = Job(tmp_path, ranks=2)
    job.post(1, "active", t_s=4.0)
    job.post(1, "done", t_s=6.5)
    job.fail(0, t_s=1.0, reason="x")
    [failed, closed] = process_windows(read_control(tmp_path))
    assert (failed.rank, failed.state, failed.opened_s, failed.ended_s) == (0, "failed", None, 1.0)
    assert failed.ended and failed.seconds is None
    assert (closed.rank, closed.steps, closed.seconds) == (1, 5, 2.5)


