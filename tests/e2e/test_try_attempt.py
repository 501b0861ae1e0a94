"""The job as a run recorded it, ready for doctor try: argv, cwd, and its environment put back.

The tests here start jobs, processes or real clocks (tests/e2e); the pure ones are in
tests/unit/test_try_attempt.py.
"""

from __future__ import annotations

import sys
from pathlib import Path


def test_a_job_past_its_time_is_stopped(tmp_path: Path) -> None:
    from doctor.command import JobCommand
    from doctor.launch import Launch, run_job

    result = run_job(JobCommand([sys.executable, "-c", "import time; time.sleep(60)"], "sleep"),
                     tmp_path, launch=Launch(timeout_s=1.0, measure_handoff=False))
    assert result.timed_out
    assert result.exit_code == 128 + 15  # SIGTERM was enough
