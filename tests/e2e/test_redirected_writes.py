"""Writes that cannot be redirected (issue 32): a symlink planted in a run directory (received,
or shared) where doctor writes (report.html, verdict.json, run.json and its temporary name,
timeline.json.gz, control.jsonl, the samples, the try record, the node records, the roofline
cache) is replaced or refused, never written through: the user's file it points at is left as
it was.

The tests here start jobs, processes or real clocks (tests/e2e); the pure ones are in
tests/unit/test_redirected_writes.py.
"""

from __future__ import annotations

from pathlib import Path

from doctor.store import layout
from tests.support import VICTIM_TEXT, doctor_cmd, plant, regular


def test_doctor_report_export_and_run_force_in_a_planted_directory(
        tmp_path: Path, victim: Path) -> None:
    job = tmp_path / "job.py"
    job.write_text("print('ok')\n")
    out = tmp_path / "run"
    assert doctor_cmd("run", "-q", "--out", str(out), str(job)).returncode == 0
    plant(out, [layout.REPORT, layout.VERDICT, layout.TIMELINE, f"{layout.TIMELINE}.tmp"],
          victim)
    report = doctor_cmd("report", str(out))
    assert report.returncode == 0, report.stderr
    as_json = doctor_cmd("report", str(out), "--format", "json", "-o", str(out / layout.VERDICT))
    assert as_json.returncode == 0, as_json.stderr
    export = doctor_cmd("export", str(out))
    assert export.returncode == 0, export.stderr
    assert victim.read_text() == VICTIM_TEXT
    assert all(regular(out / n) for n in (layout.REPORT, layout.VERDICT, layout.TIMELINE))
    names = [layout.REPORT, layout.VERDICT, layout.RUN_RECORD, f"{layout.RUN_RECORD}.tmp",
             layout.TIMELINE, f"{layout.TIMELINE}.tmp", layout.CONTROL, layout.HOST]
    plant(out, names, victim)
    forced = doctor_cmd("run", "-q", "--force", "--out", str(out), str(job))
    assert forced.returncode == 0, forced.stderr
    assert victim.read_text() == VICTIM_TEXT
    assert all(regular(out / n) for n in (layout.REPORT, layout.VERDICT, layout.RUN_RECORD,
                                          layout.TIMELINE, layout.HOST))
    assert not any(p.is_symlink() for p in out.iterdir())
