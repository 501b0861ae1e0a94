"""Nothing degrades silently, end to end: a job whose measurements raise (in its main process, in
a DataLoader worker, in the window's guard) keeps its exit status, and each probe's first
failure is its reason in verdict.json's probe table and in report.html."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from markupsafe import escape

from doctor.record.guard import GUARD_HINT
from tests.support import doctor_cmd

JOB = """
import sys
import torch
# the job's probes have started (torch is imported): make one of them fail each time it measures
probe = sys.modules["_doctor_job.probes.model_state"]
def fails(optimizers):
    raise RuntimeError("pretend measurement failure")
probe.model_state = fails
# and what a DataLoader worker measures of its memory (a forked worker inherits the patch)
def unreadable(pid=None):
    raise OSError("pretend unreadable smaps")
sys.modules["_doctor_job.probes.dataloader"].private_bytes = unreadable
model = torch.nn.Linear(16, 16)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.utils.data.TensorDataset(torch.randn(64, 16))
for (x,) in torch.utils.data.DataLoader(data, batch_size=4, num_workers=1):
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
# what a guard of the window says (the analysis reads torch_ops' status from the window too)
session = sys.modules["_doctor_job.record.session"].current()
session.swallowed("torch_ops", "closing the window before a fork", KeyError("pretend"))
sys.exit(3)
"""


def test_a_failing_measurement_is_in_the_probe_table_and_the_exit_is_the_jobs(
        tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(textwrap.dedent(JOB))
    run = tmp_path / "run"
    done = doctor_cmd("run", "--quiet", "--out", str(run), "--window", "4,3", "train.py",
                      cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    reason = "measuring the model's state failed: RuntimeError: pretend measurement failure"
    probes = json.loads((run / "verdict.json").read_text())["probes"]
    assert probes["model_state"] == {"ok": True, "reason": reason, "hint": GUARD_HINT}
    assert probes["dataloader"] == {  # said in a worker: its own process folder
        "ok": True, "hint": GUARD_HINT,
        "reason": "reading a worker's memory failed: OSError: pretend unreadable smaps"}
    assert probes["torch_ops"] == {
        "ok": True, "hint": GUARD_HINT,
        "reason": "closing the window before a fork failed: KeyError: 'pretend'"}
    html = (run / "report.html").read_text()
    assert str(escape(reason)) in html and str(escape(GUARD_HINT)) in html
