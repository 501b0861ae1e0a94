"""doctor run's progress lines: the start line from the parent's probes, and the deep window's
lines from a control file that the test writes as the job's processes would (post_window), ticked
by hand on a fake parent clock. Once for the job, never per step or per rank.

The tests here start jobs, processes or real clocks (tests/e2e); the pure ones are in
tests/unit/test_progress.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest


def test_run_job_says_its_lines_only_to_whom_launch_names(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """doctor try's runs (Launch without progress) say nothing; doctor run passes a printer."""
    import sys

    from doctor.command import JobCommand
    from doctor.launch import Launch, run_job

    job = JobCommand([sys.executable, "-c", "import sys; print('own', file=sys.stderr)"], "own")
    for name in ("silent", "said"):
        (tmp_path / name).mkdir()
    run_job(job, tmp_path / "silent", launch=Launch(measure_handoff=False))
    assert capfd.readouterr().err == "own\n"
    lines: list[str] = []
    run_job(job, tmp_path / "said", window="off",
            launch=Launch(measure_handoff=False, progress=lines.append))
    assert capfd.readouterr().err == "own\n"
    assert [line.split(" (")[0] for line in lines] == [
        f"doctor: recording own into {tmp_path / 'said'}"]
    assert "torch.profiler off); Ctrl-C stops the job" in lines[0]
