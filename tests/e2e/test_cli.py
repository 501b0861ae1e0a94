"""The CLI as a user meets it: pass-through of output and exit status, signals, and one-line
errors. The jobs here are plain Python (no torch), so each run takes about a second."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.support import doctor_cmd, record_loop, write_record


def script(tmp_path: Path, body: str, name: str = "job.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def without_progress(stderr: str) -> str:
    """stderr less doctor run's progress lines (its start line, its deep window's)."""
    return "".join(line for line in stderr.splitlines(keepends=True)
                   if not line.startswith(("doctor: recording ", "doctor: deep window ")))


@pytest.mark.parametrize("quiet", [False, True])
def test_output_and_exit_status_are_the_jobs_own(tmp_path: Path, quiet: bool) -> None:
    job = script(tmp_path, """
        import sys
        print("to stdout", sys.argv[1:])
        print("to stderr", file=sys.stderr)
        sys.exit(3)
    """)
    bare = subprocess.run([sys.executable, str(job), "--lr", "0.1"], capture_output=True,
                          text=True)
    run = doctor_cmd("run", *(["--quiet"] if quiet else []), "--out", str(tmp_path / "run"),
                     str(job), "--lr", "0.1")
    assert run.returncode == bare.returncode == 3
    assert run.stdout == bare.stdout
    # doctor's own lines come on stderr: the start line beside the job's, the summary after it
    assert without_progress(run.stderr).startswith(bare.stderr)
    started = [line for line in run.stderr.splitlines() if line.startswith("doctor: recording")]
    if quiet:
        assert started == [] and run.stderr.startswith(bare.stderr)
    else:
        [line] = started  # (GPU samples too, on a machine with one)
        assert line.startswith(f"doctor: recording job into {tmp_path / 'run'} (steps, "
                               "DataLoader waits, CPU/IO samples, ")
        assert line.endswith("stack samples, torch.profiler at steps 8-12); Ctrl-C stops the "
                             "job and still writes a partial report")
    assert "Report:" in run.stderr  # the summary stays, quiet or not
    verdict = json.loads((tmp_path / "run" / "verdict.json").read_text())
    assert verdict["partial"] is True
    assert verdict["job"]["exit_code"] == 3


def test_success_is_zero_and_not_partial(tmp_path: Path) -> None:
    job = script(tmp_path, "print('ok')\n")
    run = doctor_cmd("run", "--out", str(tmp_path / "run"), "python", str(job))
    assert run.returncode == 0, run.stderr
    assert run.stdout == "ok\n"
    verdict = json.loads((tmp_path / "run" / "verdict.json").read_text())
    assert verdict["partial"] is False
    assert verdict["bottleneck"] == "unknown"  # no steps in a job without a training loop
    assert "Report:" in run.stderr and "report.html" in run.stderr


def test_python_dash_m(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text("print('from module')\n")
    run = doctor_cmd("run", "--out", str(tmp_path / "run"), "python", "-m", "pkg.train",
                     cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "from module\n"


def test_death_by_signal_is_128_plus_n_and_still_reported(tmp_path: Path) -> None:
    job = script(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    run = doctor_cmd("run", "--out", str(tmp_path / "run"), str(job))
    assert run.returncode == 128 + signal.SIGKILL
    verdict = json.loads((tmp_path / "run" / "verdict.json").read_text())
    assert verdict["partial"] is True
    assert any("signal 9" in n for n in verdict["notes"])
    assert (tmp_path / "run" / "report.html").is_file()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_reach_the_job(tmp_path: Path, sig: int) -> None:
    # A shell without job control starts background work with SIGINT ignored, and the job
    # would inherit that, with doctor as without it: the job takes Python's own handler back.
    job = script(tmp_path, """
        import signal, sys, time
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print("ready", flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-m", "doctor.cli", "run", "--out",
                             str(tmp_path / "run"), str(job)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # no terminal: doctor must forward it
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(sig)
    proc.wait(timeout=60)
    assert proc.returncode == 128 + sig
    verdict = json.loads((tmp_path / "run" / "verdict.json").read_text())
    assert verdict["partial"] is True


@pytest.mark.parametrize("args, message", [
    (["run", "missing.py"], "no such script: missing.py"),
    (["run", "python", "missing.py"], "no such script: missing.py"),
    (["run", "ls", "-l"], "is not a Python command"),
    (["run", "no-such-command-xyz"], "command not found"),
    (["run"], "no command given"),
    (["run", "--window", "soon", "x.py"], "--window takes START,STEPS"),
    (["run", "--window", "0,5", "x.py"], "--window takes START,STEPS"),
    (["run", "--window", "8,5,1", "x.py"], "--window takes START,STEPS"),
    (["report", "no-such-dir"], "no such run directory or trace"),
    (["report", "README.md"], "is not a trace"),
    (["compare", "no-such-dir", "README.md"], "no such run directory: no-such-dir"),
    (["compare", ".", "README.md"], "no such run directory: README.md"),
    (["export", "README.md"], "no such run directory: README.md"),
    (["report", "--steps", "9:3", "."], "--steps takes FIRST:LAST"),
    (["report", "--steps", "all", "."], "--steps takes FIRST:LAST"),
])
def test_user_errors_are_one_line_and_exit_2(tmp_path: Path, args: list[str],
                                              message: str) -> None:
    (tmp_path / "README.md").write_text("hi")
    run = doctor_cmd(*args, cwd=tmp_path)
    assert run.returncode == 2
    assert "Traceback" not in run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("doctor: ")
    assert message in lines[0]


def test_unwritable_out_is_refused(tmp_path: Path) -> None:
    job = script(tmp_path, "print('never runs')\n")
    blocker = tmp_path / "file"
    blocker.write_text("")
    run = doctor_cmd("run", "--out", str(blocker / "run"), str(job))
    assert run.returncode == 2
    assert run.stdout == ""
    assert run.stderr.startswith("doctor: cannot write the run directory")
    assert len(run.stderr.strip().splitlines()) == 1


def test_report_without_runs_says_what_to_do(tmp_path: Path) -> None:
    run = doctor_cmd("report", cwd=tmp_path)
    assert run.returncode == 2
    assert "run `doctor run train.py` first" in run.stderr


def test_report_formats_on_the_newest_run(tmp_path: Path) -> None:
    job = script(tmp_path, "print('x')\n")
    for _ in range(2):
        assert doctor_cmd("run", str(job), cwd=tmp_path).returncode == 0
        time.sleep(0.01)  # distinct mtimes for "newest", not a timing assertion
    runs = sorted((tmp_path / "doctor-runs").iterdir())
    assert len(runs) == 2
    as_json = doctor_cmd("report", "--format", "json", cwd=tmp_path)
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["schema"] == "doctor.verdict/1"
    as_text = doctor_cmd("report", "--format", "text", cwd=tmp_path)
    assert "No verdict" in as_text.stdout
    out = tmp_path / "r.html"
    as_html = doctor_cmd("report", str(runs[0]), "-o", str(out), cwd=tmp_path)
    assert as_html.returncode == 0 and out.read_text().startswith("<!DOCTYPE html>")


def test_report_on_a_step_range(tmp_path: Path) -> None:

    run_dir = tmp_path / "run"
    record_loop(run_dir, 60, wait_s=0.09, compute_s=0.01, then=(60, 0.001, 0.05))
    write_record(run_dir)
    first = doctor_cmd("report", str(run_dir), "--steps", ":55", "--format", "json")
    assert first.returncode == 0, first.stderr
    verdict = json.loads(first.stdout)
    assert verdict["steps"]["range"] == [1, 55]
    assert verdict["bottleneck"] == "input"
    later = doctor_cmd("report", str(run_dir), "--steps", "65:", "--format", "json")
    assert json.loads(later.stdout)["bottleneck"] == "compute"
    past = doctor_cmd("report", str(run_dir), "--steps", "500:")
    assert past.returncode == 2
    assert past.stderr.strip() == "doctor: --steps from step 500: the run has 119 steps per rank"


def test_help_documents_both_commands() -> None:
    top = doctor_cmd("--help")
    assert top.returncode == 0 and "run" in top.stdout and "report" in top.stdout
    run = doctor_cmd("run", "--help")
    assert "torchrun" in run.stdout and "--out" in run.stdout
    assert doctor_cmd("--version").stdout.strip().endswith(__import__("doctor").__version__)


def test_a_job_that_shadows_sitecustomize_still_runs_it(tmp_path: Path) -> None:
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text("import os\nos.environ['MINE'] = '1'\n")
    job = script(tmp_path, "import os\nprint(os.environ.get('MINE'))\n")
    run = doctor_cmd("run", "--out", str(tmp_path / "run"), str(job),
                     env={"PYTHONPATH": str(tmp_path / "site")})
    assert run.stdout == "1\n"


def test_the_bootstrap_never_imports_torch_itself(tmp_path: Path) -> None:
    job = script(tmp_path, "import sys\nprint('torch' in sys.modules)\n")
    run = doctor_cmd("run", "--out", str(tmp_path / "run"), str(job))
    assert run.stdout == "False\n"


def test_an_inherited_window_doctor_does_not_take_is_refused_before_the_job_runs(
        tmp_path: Path) -> None:
    job = script(tmp_path, "print('ran')\n")
    run = doctor_cmd("run", "--out", str(tmp_path / "run"), str(job), cwd=tmp_path,
                     env={"DOCTOR_WINDOW": "soon"})
    assert run.returncode == 2 and "ran" not in run.stdout
    lines = run.stderr.strip().splitlines()
    assert lines == ["doctor: DOCTOR_WINDOW takes START,STEPS (e.g. 8,5) or off, not 'soon'"]
    assert not (tmp_path / "run").exists()


def test_a_broken_doctor_in_the_job_does_not_stop_it(tmp_path: Path) -> None:
    # the bootstrap's own code fails to import: the job runs, the run directory says why
    import shutil

    from doctor.launch import BOOTSTRAP_DIR, job_environment

    broken = tmp_path / "install" / "doctor"
    (broken / "record" / "_bootstrap").mkdir(parents=True)
    shutil.copy(BOOTSTRAP_DIR / "sitecustomize.py", broken / "record" / "_bootstrap")
    (broken / "record" / "__init__.py").write_text("")
    (broken / "bootstrap.py").write_text("raise ImportError('broken')\n")
    job = script(tmp_path, "print('ran')\n")
    child_env = job_environment(tmp_path / "run", None)
    child_env["PYTHONPATH"] = str(broken / "record" / "_bootstrap")
    (tmp_path / "run").mkdir()
    out = subprocess.run([sys.executable, str(job)], env={**os.environ, **child_env},
                         capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout == "ran\n"
    errors = list((tmp_path / "run" / "bootstrap-errors").glob("*.txt"))
    assert errors and "broken" in errors[0].read_text()


def test_a_broken_doctor_of_the_jobs_own_is_not_doctors(tmp_path: Path) -> None:
    # a 'doctor' on the job's path that fails to import is the job's business: doctor's
    # bootstrap loads its own code under a private name and records as ever
    (tmp_path / "site" / "doctor").mkdir(parents=True)
    (tmp_path / "site" / "doctor" / "__init__.py").write_text("raise ImportError('broken')\n")
    job = script(tmp_path, "print('ran')\n")
    from doctor.launch import job_environment

    child_env = job_environment(tmp_path / "run", None)
    child_env["PYTHONPATH"] += os.pathsep + str(tmp_path / "site")
    (tmp_path / "run").mkdir()
    out = subprocess.run([sys.executable, str(job)], env={**os.environ, **child_env},
                         capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout == "ran\n"
    assert not (tmp_path / "run" / "bootstrap-errors").exists()


def test_a_run_directory_an_older_doctor_recorded_is_refused_in_one_line(tmp_path: Path) -> None:

    old = tmp_path / "old"
    session = record_loop(old, 10)
    write_record(old)
    ring = session.directory / "optimizer.ring"
    data = bytearray(ring.read_bytes())
    data[4:8] = (1).to_bytes(4, "little")  # the header of doctor's first ring format
    ring.write_bytes(bytes(data))
    result = doctor_cmd("report", str(old), "--format", "json")
    assert result.returncode == 2
    assert result.stdout == ""
    [line] = result.stderr.strip().splitlines()
    assert "was recorded by another doctor (its rings are version 1" in line
    assert "record the job again" in line
    (old / "run.json").write_text(json.dumps({"schema": "doctor.run/0"}))
    [line] = doctor_cmd("report", str(old)).stderr.strip().splitlines()
    assert "recorded in format doctor.run/0; this doctor reads doctor.run/1 and" in line
