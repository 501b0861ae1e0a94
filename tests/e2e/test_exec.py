"""A process that ``os.execv``s another Python under ``doctor run``: the new image keeps its pid,
and before the fix its Session recreated the process folder and truncated the rings of the
steps recorded before the exec."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support import doctor_cmd

#: 20 steps (the window at 8,5 runs), then an exec into a Python that trains 5 steps of its own.
EXEC_JOB = textwrap.dedent("""
    import os, sys
    import torch

    TRAIN = '''
    import torch
    model = torch.nn.Linear(32, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(STEPS):
        opt.zero_grad()
        model(torch.randn(16, 32)).pow(2).mean().backward()
        opt.step()
    '''
    exec(TRAIN.replace("STEPS", "20"))
    print("before exec", os.getpid(), flush=True)
    after = TRAIN.replace("STEPS", "5") + "print('after exec', __import__('os').getpid())"
    os.execv(sys.executable, [sys.executable, "-c", after])
""")


@pytest.mark.e2e
def test_an_exec_keeps_what_was_recorded_before_it(tmp_path: Path) -> None:
    job = tmp_path / "job.py"
    job.write_text(EXEC_JOB)
    out = tmp_path / "run"
    result = doctor_cmd("run", "--out", str(out), "--", sys.executable, str(job), cwd=tmp_path,
                        timeout=300)
    assert result.returncode == 0, result.stderr
    before, after = result.stdout.splitlines()
    pid = before.split()[-1]
    assert after == f"after exec {pid}"  # one process, two images
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["steps"]["count"] == 19  # the 20 steps before the exec, analysed
    assert verdict["probes"]["torch_ops"]["ok"] is True  # and their window
    first = out / "rank-0" / f"main-{pid}"
    second = out / "rank-0" / f"main-{pid}.1"
    assert (first / "trace.json.gz").is_file()
    assert "-c" in json.loads((second / "meta.json").read_text())["argv"]  # the new image's
    assert (second / "optimizer.ring").is_file()


