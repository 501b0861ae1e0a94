"""The doctor run process waits for the job's end without polling (doctor.exit_wait)."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from doctor.exit_wait import ExitWait


def _job(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code])


def test_the_exit_status_and_a_signal_come_back() -> None:
    for code, expected in (("import sys; sys.exit(3)", 3),
                           ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -9)):
        proc = _job(code)
        waiter = ExitWait(proc)
        try:
            assert waiter.wait(60) == expected
        finally:
            waiter.close()


def test_a_job_that_runs_on_is_not_waited_for_past_the_timeout() -> None:
    proc = _job("import time; time.sleep(60)")
    waiter = ExitWait(proc)
    try:
        assert waiter.wait(0.05) is None
        proc.kill()
        assert waiter.wait(60) == -9
    finally:
        waiter.close()
        proc.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pidfd is Linux's")
def test_waiting_wakes_the_parent_a_few_times_not_every_few_milliseconds() -> None:
    """The wait sleeps until the job ends: a handful of voluntary context switches of this
    thread, where Popen.wait(timeout) polls ~25 times over the same second."""
    def switches() -> int:
        return resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw

    proc = _job("import time; time.sleep(1.0)")
    waiter = ExitWait(proc)
    try:
        before = switches()
        assert waiter.wait(60) == 0
        ours = switches() - before
    finally:
        waiter.close()
    proc = _job("import time; time.sleep(1.0)")
    before = switches()
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.9)
    polled = switches() - before
    proc.wait()
    assert ours <= 4 < 10 <= polled, (ours, polled)
