"""py-spy missing, refused when doctor checks it, refused when it records: each has its own
reason and hint, never a Rust backtrace, and the in-process sampler gives the stacks instead
(doctor.probes.py_spy, doctor.probes.stacks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from doctor.probes.py_spy import (
    PTRACE_HINT,
    RECORD_HINT,
)
from doctor.probes.stacks import PySpyRecorder
from tests.support import PY_SPY_SUSPEND_ERROR, run_together

#: A py-spy that reads processes (``dump``) but may not pause them (``record``): the job's
#: processes (``RECORD_FAILS=job``: all but doctor's throwaway, which prints 'ready') or all.
FAKE_PY_SPY = """\
#!{python}
import os, sys
args = sys.argv[1:]
if args and args[0] == "dump":
    print("Thread 1 (idle): MainThread")
    sys.exit(0)
if args and args[0] == "record":
    pid = args[args.index("--pid") + 1]
    cmdline = open(f"/proc/{{pid}}/cmdline", "rb").read()
    if os.environ.get("RECORD_FAILS") == "job" and b"ready" in cmdline:
        out = args[args.index("--output") + 1]
        open(out, "w").write("MainThread;<module> (x.py:1) 1\\n")
        sys.exit(0)
    sys.stderr.write({error!r})
    sys.exit(1)
sys.exit(2)
"""

JOB = """\
import time
import torch
from torch.utils.data import DataLoader

def slow_read(i):
    time.sleep(0.01)
    return torch.randn(8)

class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 4000
    def __getitem__(self, i):
        return slow_read(i)

model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step, x in enumerate(DataLoader(Data(), batch_size=4)):
    if step == 250:
        break
    model(x).sum().backward()
    opt.step(); opt.zero_grad()
"""


def test_a_py_spy_refused_at_the_check_gives_the_ptrace_hint(tmp_path: Path) -> None:
    spy = _fake_py_spy(tmp_path, dump_ok=False)
    recorder = PySpyRecorder(tmp_path / "run", py_spy=str(spy))
    (tmp_path / "run").mkdir()
    recorder._check_ptrace()
    status = recorder.check()
    assert status.reason.startswith("in-process sampler (ptrace refused")
    assert status.hint == PTRACE_HINT and "backtrace" not in status.reason.lower()


def _fake_py_spy(folder: Path, dump_ok: bool = True) -> Path:
    spy = folder / "py-spy"
    text = FAKE_PY_SPY.format(python=sys.executable, error=PY_SPY_SUSPEND_ERROR)
    if not dump_ok:
        text = text.replace('if args and args[0] == "dump":', 'if False:')
    spy.write_text(text)
    spy.chmod(0o755)
    return spy


FAILS = ("all", "job")


@pytest.fixture(scope="module")
def refused_runs(tmp_path_factory: pytest.TempPathFactory
                 ) -> dict[str, tuple[subprocess.CompletedProcess[str], Path]]:
    """``doctor run`` of the job with each fake py-spy, the two at once (the job waits on its
    reads for about 10 s, longer than the stack span: most of it is sleep)."""
    commands, env, outs = {}, {}, {}
    for fails in FAILS:
        folder = tmp_path_factory.mktemp(f"refused-{fails}")
        bin_dir = folder / "bin"
        bin_dir.mkdir()
        _fake_py_spy(bin_dir)
        job = folder / "job.py"
        job.write_text(JOB)
        outs[fails] = folder / "run"
        commands[fails] = [sys.executable, "-m", "doctor.cli", "run", "--out",
                           str(outs[fails]), "--", sys.executable, str(job)]
        env[fails] = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                      "RECORD_FAILS": fails, "OMP_NUM_THREADS": "1"}
    done = run_together(commands, env=env)
    return {fails: (done[fails], outs[fails]) for fails in FAILS}


@pytest.mark.e2e
@pytest.mark.parametrize("fails", FAILS)
def test_a_py_spy_refused_at_record_leaves_the_stacks_to_the_in_process_sampler(
        refused_runs: dict[str, tuple[subprocess.CompletedProcess[str], Path]],
        fails: str) -> None:
    """``all``: record refused on doctor's throwaway too (caught before the window);
    ``job``: refused only on the job's processes, after the window opened."""
    result, out = refused_runs[fails]
    assert result.returncode == 0, result.stderr[-3000:]
    stacks = json.loads((out / "run.json").read_text())["probes"]["stacks"]
    assert stacks["reason"].startswith("in-process sampler (py-spy record was refused")
    assert stacks["hint"] == RECORD_HINT
    (meta,) = out.glob("rank-0/main-*/stacks.json")
    assert json.loads(meta.read_text())["recorder"] == "in-process"
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["probes"]["stacks"]["ok"], verdict["probes"]["stacks"]
    report = (out / "report.html").read_text() + json.dumps(verdict)
    assert "Stack backtrace" not in report and "python_spy.rs" not in report
    assert "run 15 steps or more" not in json.dumps(verdict["probes"]["stacks"])
