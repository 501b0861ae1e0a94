"""A full or failing disk never reaches the job: rings reserve their blocks as they grow and stop
(said once) when they cannot; doctor's other writes in the job stop the same way; ``doctor run``
with no room at the start runs the job without doctor; at the end, one line, never a traceback.

Real full filesystems are a 4 MB tmpfs (skipped, with the reason, where mount is refused) and a
file-size limit (RLIMIT_FSIZE) set by the job itself, which needs no privilege.

The tests here start jobs, processes or real clocks (tests/e2e); the pure ones are in
tests/unit/test_full_disk.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import doctor_cmd

FILL_JOB = textwrap.dedent("""
    import os, sys
    import torch

    big, then = sys.argv[1], sys.argv[2]  # then: "free" the space before exiting, or "keep"
    fill_at = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 8)
    for step in range(1200):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        if step == fill_at:  # a checkpoint beside the run directory fills the disk
            try:
                with open(big, "wb") as f:
                    while True:
                        f.write(bytes(1 << 16))
            except OSError as err:
                print(f"disk full: {err.strerror}", flush=True)
    if then == "free":
        os.unlink(big)
    print("job done", flush=True)
    sys.exit(3)
""")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MB tmpfs (the test needs root, or skips saying why)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip() or 'not root'}); "
                    "the RLIMIT_FSIZE test covers a full disk without mount")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _job(tmp_path: Path) -> Path:
    job = tmp_path / "fill_job.py"
    job.write_text(FILL_JOB)
    return job


def _no_traceback(result: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert "Bus error" not in result.stderr and result.returncode != 135, result.stderr


@pytest.mark.e2e
def test_a_disk_that_fills_mid_run_never_reaches_the_job(tmp_path: Path,
                                                          small_disk: Path) -> None:
    out = small_disk / "run"
    result = doctor_cmd("run", "--window", "off", "--out", str(out), "--", sys.executable,
                        str(_job(tmp_path)), str(small_disk / "big.bin"), "free")
    _no_traceback(result)
    assert result.returncode == 3, result.stderr  # the job's own status
    assert result.stdout == "disk full: No space left on device\njob done\n"
    verdict = json.loads((out / "verdict.json").read_text())
    assert (out / "report.html").is_file()
    assert verdict["partial"] is True
    steps = verdict["probes"]["steps"]
    assert not steps["ok"] and steps["reason"].startswith("stopped: no space left on device")
    assert any("stopped (no space left on device)" in note for note in verdict["notes"])


@pytest.mark.e2e
def test_a_disk_still_full_at_the_end_is_one_line(tmp_path: Path, small_disk: Path) -> None:
    out = small_disk / "run"
    result = doctor_cmd("run", "--window", "off", "--out", str(out), "--", sys.executable,
                        str(_job(tmp_path)), str(small_disk / "big.bin"), "keep")
    _no_traceback(result)
    assert result.returncode == 3
    assert result.stdout.endswith("job done\n")
    doctor_lines = [line for line in result.stderr.splitlines()
                    if line.startswith("doctor: cannot")]
    assert len(doctor_lines) == 1 and "No space left on device" in doctor_lines[0]


@pytest.mark.e2e
def test_a_disk_that_fills_inside_the_window_leaves_the_jobs_stderr_alone(
        tmp_path: Path, small_disk: Path) -> None:
    """The disk fills while the profiler runs: its trace cannot be written. The window fails
    (said by doctor), and torch prints nothing into the job's stderr (a profiler stopped twice
    made it warn "disableProfiler called but no active profiling session found")."""
    out = small_disk / "run"
    result = doctor_cmd("run", "--window", "8,8", "--out", str(out), "--", sys.executable,
                        str(_job(tmp_path)), str(small_disk / "big.bin"), "free", "10")
    _no_traceback(result)
    assert result.returncode == 3
    assert result.stdout == "disk full: No space left on device\njob done\n"
    assert "deep window failed" in result.stderr, result.stderr
    foreign = [line for line in result.stderr.splitlines()
               if line.strip() and not line.startswith(("doctor", " ", "PARTIAL", "Report",
                                                         "Timeline", "Top", "Probes", "Note"))]
    assert foreign == [], result.stderr


@pytest.mark.e2e
def test_a_disk_full_at_the_start_still_runs_the_job(tmp_path: Path, small_disk: Path) -> None:
    with open(small_disk / "big.bin", "wb") as f:
        try:
            while True:
                f.write(bytes(1 << 16))
        except OSError:
            pass
    job = tmp_path / "job.py"
    job.write_text("import sys\nprint('ran', flush=True)\nsys.exit(5)\n")
    result = doctor_cmd("run", "--out", str(small_disk / "run"), "--", sys.executable, str(job))
    _no_traceback(result)
    assert result.returncode == 5
    assert result.stdout == "ran\n"
    assert "running the job without doctor" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


LIMITED_JOB = textwrap.dedent("""
    import resource, signal, sys
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (48 << 10, 48 << 10))
    import torch

    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 8)
    for step in range(2500):  # the optimizer ring passes 48 KB at about 1,700 steps
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    print("job done", flush=True)
""")


@pytest.mark.e2e
def test_a_file_size_limit_in_the_job_stops_the_rings_not_the_job(tmp_path: Path) -> None:
    job = tmp_path / "limited.py"
    job.write_text(LIMITED_JOB)
    out = tmp_path / "run"
    result = doctor_cmd("run", "--window", "off", "--out", str(out), "--", sys.executable,
                        str(job))
    _no_traceback(result)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "job done\n"
    verdict: dict[str, Any] = json.loads((out / "verdict.json").read_text())
    steps = verdict["probes"]["steps"]
    assert not steps["ok"] and steps["reason"].startswith("stopped: file too large")
    assert verdict["partial"] is True
    [ring] = out.glob("rank-0/main-*/optimizer.ring")
    assert ring.stat().st_size <= 48 << 10


@pytest.mark.e2e
def test_doctor_watch_on_a_full_disk_runs_the_code_it_wraps(tmp_path: Path,
                                                           small_disk: Path) -> None:
    with open(small_disk / "big.bin", "wb") as f:
        try:
            while True:
                f.write(bytes(1 << 16))
        except OSError:
            pass
    code = textwrap.dedent(f"""
        import doctor
        with doctor.watch(out={str(small_disk / 'run')!r}):
            print("ran", flush=True)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    _no_traceback(result)
    assert result.returncode == 0 and result.stdout == "ran\n"
    assert "the job runs without doctor.watch" in result.stderr
