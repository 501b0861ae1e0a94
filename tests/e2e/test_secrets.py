"""Secrets stay out (issue 32): values of secret-looking arguments, ``NAME=value`` words,
secret-named environment variables and URL passwords never reach a file of the run directory
(every file read, the .gz ones gunzipped) nor what doctor prints; doctor try refuses a command
whose secrets were hidden, in one line."""

from __future__ import annotations

import gzip
import json
import os
import textwrap
from pathlib import Path

import pytest

from doctor.store import layout
from doctor.store.redact import (
    REDACTED,
    redact_argv,
)
from tests.support import ENV, SECRETS, doctor_cmd

ARGV = ["--api-key", SECRETS[0], f"--password={SECRETS[1]}", "--token", SECRETS[2],
        "--db-url", f"postgres://me:{SECRETS[3]}@db.example:5432/x", f"HF_TOKEN={SECRETS[4]}",
        "--Auth_Token", SECRETS[5], "--lr", "0.1"]


JOB = """
import sys
import torch
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(16):
    opt.zero_grad()
    model(torch.randn(8, 4)).sum().backward()
    opt.step()
print("done", len(sys.argv))
"""


def file_texts(run_dir: Path) -> dict[Path, bytes]:
    """Every file of the run directory, gunzipped where it is gzipped."""
    out = {}
    for path in run_dir.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            out[path] = gzip.decompress(data) if path.name.endswith(".gz") else data
    return out


def leaked(texts: dict[Path, bytes] | str) -> list[str]:
    if isinstance(texts, str):
        return [s for s in SECRETS if s in texts]
    return [f"{p.name}: {s}" for p, data in texts.items() for s in SECRETS if s.encode() in data]


@pytest.mark.e2e
def test_secrets_in_argv_and_env_stay_out_of_the_run_and_what_doctor_shows(
        tmp_path: Path) -> None:
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent(JOB))
    out = tmp_path / "run"
    run = doctor_cmd("run", "--out", str(out), str(job), *ARGV, env=ENV, timeout=300)
    assert run.returncode == 0 and run.stdout == f"done {len(ARGV) + 1}\n", run.stderr[-3000:]
    assert leaked(run.stderr) == []  # the terminal summary
    texts = file_texts(out)
    names = {p.name for p in texts}
    assert {layout.RUN_RECORD, layout.META, layout.VERDICT, layout.REPORT, layout.TIMELINE,
            layout.TRACE_GZ} <= names  # the window ran: the trace is among the files read
    assert leaked(texts) == []
    record = json.loads((out / layout.RUN_RECORD).read_text())
    assert record["argv"][-len(ARGV):] == redact_argv(ARGV)
    assert record["env"]["MASTER_ADDR"] == f"me:{REDACTED}@127.0.0.1"
    assert "HF_TOKEN" not in record["env"] and "TORCH_HUB_TOKEN" not in record["env"]
    [meta] = out.glob(f"rank-0/*/{layout.META}")
    assert json.loads(meta.read_text())["argv"][-len(ARGV):] == redact_argv(ARGV)
    for fmt in ("text", "json", "html"):
        shown = doctor_cmd("report", str(out), "--format", fmt, "-o", str(tmp_path / fmt))
        assert shown.returncode == 0, shown.stderr
        assert leaked((tmp_path / fmt).read_text()) == []
    text = doctor_cmd("report", str(out), "--format", "text")
    assert leaked(text.stdout) == [] and "--api-key '<redacted>'" in text.stdout
    # doctor try cannot run the command it was not given: one line, before anything runs
    tried = doctor_cmd("try", str(out), "--yes", "--dry-run")
    assert tried.returncode == 2, tried.stderr
    assert tried.stderr == (f"doctor: {out} recorded its command with secrets hidden "
                            f"({REDACTED}), so doctor try cannot run it again: pass the secret "
                            "by environment variable (e.g. HF_TOKEN) and record the run again\n")


def test_a_run_recorded_before_redaction_is_shown_without_its_secrets(tmp_path: Path) -> None:
    """A run directory written by an older doctor (its run.json has the secrets): the reports
    made of it now hide them."""
    job = tmp_path / "job.py"
    job.write_text("print('ok')\n")
    out = tmp_path / "run"
    assert doctor_cmd("run", "-q", "--out", str(out), str(job)).returncode == 0
    record = json.loads((out / layout.RUN_RECORD).read_text())
    record["argv"] = [*record["argv"], *ARGV]
    (out / layout.RUN_RECORD).write_text(json.dumps(record))
    for fmt in ("text", "json"):
        shown = doctor_cmd("report", str(out), "--format", fmt)
        assert shown.returncode == 0 and leaked(shown.stdout) == [], shown.stdout
    assert doctor_cmd("report", str(out)).returncode == 0
    assert leaked((out / layout.REPORT).read_text()) == []


def test_the_environment_doctor_try_restores_keeps_the_shells_password(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from doctor.tries.attempt import recorded_job

    job = tmp_path / "job.py"
    job.write_text("print('ok')\n")
    out = tmp_path / "run"
    run = doctor_cmd("run", "-q", "--out", str(out), str(job),
                     env={"MASTER_ADDR": "me:pw@10.0.0.1", "OMP_NUM_THREADS": "3"})
    assert run.returncode == 0, run.stderr
    now = {**os.environ, "MASTER_ADDR": "me:pw@10.0.0.1"}
    now.pop("OMP_NUM_THREADS", None)
    recorded = recorded_job(out, now)
    assert recorded.env["MASTER_ADDR"] == "me:pw@10.0.0.1"  # never the redacted word
    assert recorded.env["OMP_NUM_THREADS"] == "3"
    assert any("MASTER_ADDR as in this shell" in n for n in recorded.notes)
