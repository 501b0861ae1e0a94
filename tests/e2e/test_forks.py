"""Forked children under ``doctor run``: a child forked before, during or after the profiler
window ends as it would without doctor (its own exit status, the job's output unchanged), and the
job ends. Before the fix, a child forked during or after the window hung in Kineto's static
destructors and its parent waited for it forever."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

HANG_S = 150  # a job that has not ended by then hangs (it takes seconds; the machine is shared)

#: A small training loop that forks at the steps named on its command line; each child ends by
#: sys.exit(3) (``exit``) or by falling off the end of the script (``end``), its parent waits
#: for it and prints its exit status. The window (--window 8,5) is open after steps 8-12.
FORKING_JOB = textwrap.dedent("""
    import os, sys
    import torch

    fork_at = {int(s) for s in sys.argv[1].split(",")}
    how = sys.argv[2]
    # one intra-op thread: a child forked after the parent ran an OpenMP parallel region hangs
    # in its first parallel op, bare as under doctor (seen on an AMD EPYC VM, where MKL runs
    # this job's small GEMMs in parallel); what is tested here is doctor's window and Kineto
    torch.set_num_threads(1)

    def train():
        torch.manual_seed(0)
        model = torch.nn.Linear(32, 8)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        children = []
        for step in range(1, 21):
            opt.zero_grad()
            model(torch.randn(16, 32)).pow(2).mean().backward()
            opt.step()
            if step in fork_at:
                pid = os.fork()
                if pid == 0:
                    model(torch.randn(4, 32)).sum()  # the child uses torch too
                    print(f"child of step {step} ends", flush=True)
                    if how == "exit":
                        sys.exit(3)
                    return True  # the end of the script
                children.append((step, pid))
        for step, pid in children:
            _, status = os.waitpid(pid, 0)
            print(f"child of step {step}: exit {os.waitstatus_to_exitcode(status)}", flush=True)
        return False

    if not train():
        print("parent done", flush=True)
""")

POOL_JOB = textwrap.dedent("""
    import multiprocessing as mp
    import torch

    def square(x):
        return int(torch.tensor(x) ** 2)

    if __name__ == "__main__":
        model = torch.nn.Linear(32, 8)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(20):
            opt.zero_grad()
            model(torch.randn(16, 32)).pow(2).mean().backward()
            opt.step()
        with mp.get_context("fork").Pool(2) as pool:
            print(pool.map(square, range(6)), flush=True)
        pool.join()
        print("parent done", flush=True)
""")


def run_to_the_end(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` in a session of its own; fail (after killing all of it) if it hangs."""
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd[-3:])} did not end in {HANG_S} s (a forked child hangs)\n"
                    f"stdout: {out}\nstderr: {err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def bare_and_doctor(tmp_path: Path, script: str, *args: str
                    ) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    job = tmp_path / "job.py"
    job.write_text(script)
    bare = run_to_the_end([sys.executable, str(job), *args], tmp_path)
    doctor = run_to_the_end([sys.executable, "-m", "doctor.cli", "run", "--window", "8,5",
                             "--out", str(tmp_path / "run"), "--", sys.executable, str(job),
                             *args], tmp_path)
    return bare, doctor


def main_meta(run_dir: Path) -> dict[str, Any]:
    [meta] = run_dir.glob("rank-0/main-*/meta.json")
    return dict(json.loads(meta.read_text()))


@pytest.mark.e2e
@pytest.mark.parametrize("how, status", [("exit", 3), ("end", 0)])
def test_children_forked_before_during_and_after_the_window_end(
        tmp_path: Path, how: str, status: int) -> None:
    bare, doctor = bare_and_doctor(tmp_path, FORKING_JOB, "3,10,17", how)
    assert bare.returncode == 0, bare.stderr
    for step in (3, 10, 17):
        assert f"child of step {step}: exit {status}" in bare.stdout
    assert doctor.returncode == 0, doctor.stderr
    assert doctor.stdout == bare.stdout  # the job's own output, children's included
    window = main_meta(tmp_path / "run")["window"]
    assert window["state"] == "done"
    assert window["closed_by"] == "fork"  # the fork at step 10 closed it, before the child
    assert (tmp_path / "run" / "verdict.json").is_file()


@pytest.mark.e2e
def test_a_fork_pool_after_the_window(tmp_path: Path) -> None:
    bare, doctor = bare_and_doctor(tmp_path, POOL_JOB)
    assert bare.returncode == 0, bare.stderr
    assert bare.stdout == "[0, 1, 4, 9, 16, 25]\nparent done\n"
    assert doctor.returncode == 0, doctor.stderr
    assert doctor.stdout == bare.stdout
    assert main_meta(tmp_path / "run")["window"]["state"] == "done"


#: torch.profiler used by hand, then doctor's teardown of Kineto's thread, then a fork.
BY_HAND = textwrap.dedent("""
    import os, sys
    import torch
    from torch.profiler import profile
    from doctor.record.kineto import stop_config_thread

    threads = len(os.listdir("/proc/self/task"))
    with profile():
        torch.nn.Linear(8, 8)(torch.randn(2, 8))
    print(len(os.listdir("/proc/self/task")) - threads, stop_config_thread(),
          len(os.listdir("/proc/self/task")) - threads, flush=True)
    pid = os.fork()
    if pid == 0:
        sys.exit(3)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
""")


def test_the_profilers_thread_is_stopped_and_a_later_fork_ends(tmp_path: Path) -> None:
    job = tmp_path / "by_hand.py"
    job.write_text(BY_HAND)
    result = run_to_the_end([sys.executable, str(job)], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "1 stopped 0\n3\n"  # Kineto's one thread, then none; the child's 3


#: A Session and its window in a process of its own: a fork while the window is open.
FORK_IN_WINDOW = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    import torch
    from doctor.probes.torch_ops import DeepWindow
    from doctor.record.session import STEP_OPTIMIZER, Session

    session = Session(Path(sys.argv[1]), window_start=2, window_steps=5)
    window = DeepWindow.for_session(session)
    window.start()
    for _ in range(3):
        torch.ones(4).sum()
        session.count_step(STEP_OPTIMIZER)
    assert window.state == "active"
    pid = os.fork()
    if pid == 0:  # 10 without a profiler, 11 with one
        os._exit(10 + int(torch.autograd._profiler_enabled()))
    record = window._record
    print(window.state, record["closed_by"], record["steps_profiled"], record["kineto_thread"],
          os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
""")


def test_a_fork_inside_the_window_closes_it_first(tmp_path: Path) -> None:
    job = tmp_path / "fork_in_window.py"
    job.write_text(FORK_IN_WINDOW)
    result = run_to_the_end([sys.executable, str(job), str(tmp_path)], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "done fork 1 stopped 10\n"  # the child inherited no profiler
    assert (tmp_path / "rank-0").is_dir()
    assert len(list(tmp_path.glob("rank-0/main-*/trace.json"))) == 1  # the window exported
