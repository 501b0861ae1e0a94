"""Shared fixtures: a fake clock, a runner for the doctor CLI, and a guard against samplers
left running by a test."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_JOBS = ROOT / "sample_jobs"


class FakeClock:
    """A monotonic clock in ns that only moves when a test ticks it."""

    def __init__(self, start_ns: int = 1_000_000_000) -> None:
        self.now = start_ns

    def __call__(self) -> int:
        return self.now

    def tick(self, seconds: float) -> int:
        self.now += int(seconds * 1e9)
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(autouse=True)
def no_sampler_left_running() -> Iterator[None]:
    before = {t.ident for t in threading.enumerate()}
    yield
    left = [t for t in threading.enumerate()
            if t.ident not in before and t.name.startswith("doctor") and t.is_alive()]
    assert not left, f"test left doctor threads running: {[t.name for t in left]}"


def doctor_cmd(*args: str, cwd: Path | None = None, timeout: float = 180,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the doctor CLI as a user would, capturing its output."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "doctor.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, env=full_env)




def parallel_cores() -> float:
    """How many of two busy processes the machine runs at once now (2.0: both, 1.0: one at a
    time): a shared VM's second core is sometimes not there."""
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c",
                               "import time\nc = time.process_time()\n"
                               "while time.process_time() - c < 0.3:\n    pass\n"])
             for _ in range(2)]
    for p in procs:
        p.wait()
    wall = time.perf_counter() - t0
    return min(2.0, 0.6 / max(wall - 0.05, 1e-3))  # 0.05 s: the two interpreters' start


def skip_if_the_cores_were_taken(what: str) -> None:
    """After a measurement that needed two cores came out short: skip, saying why, when the
    machine does not run two busy processes at once now either (the fixture two_cores looked
    before the measurement only: a shared VM's second core comes and goes); else return, and the
    test fails as it should."""
    got = parallel_cores()
    if got < 1.6:
        pytest.skip(f"{what}, and the machine runs two busy processes at {got:.1f}x one's speed "
                    "now, not 2x (a shared VM's second core taken during the measurement)")


@pytest.fixture
def two_cores() -> None:
    """For tests whose job must run two processes at once (a DataLoader's workers beside the
    training loop) to show what they assert: skipped, with the reason, when the machine runs
    two busy processes at well under twice the speed of one."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: two processes cannot run at once")
    got = parallel_cores()
    if got < 1.6:
        pytest.skip(f"the machine runs two busy processes at {got:.1f}x one's speed now, not 2x "
                    "(a shared VM's second core taken): workers cannot show a speedup")
