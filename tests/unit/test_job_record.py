"""run.json's end part (doctor.job_record.RunEnd), as each door writes it."""

from __future__ import annotations

from doctor.job_record import RunEnd, run_record
from doctor.verdict import ProbeStatus


def test_doctor_runs_end_keeps_its_keys_and_leaves_out_what_did_not_happen() -> None:
    probes = {"host": ProbeStatus(True), "gpu": ProbeStatus(False, "NVML found no GPU", "h")}
    end = RunEnd(137, 2.5, probes, signal=9, fd_handoff_s=None, peaks={"cpu": 1.0})
    assert end.to_dict() == {
        "exit_code": 137, "signal": 9, "duration_s": 2.5,
        "probes": {"host": {"ok": True},
                   "gpu": {"ok": False, "reason": "NVML found no GPU", "hint": "h"}},
        "fd_handoff_s": None, "peaks": {"cpu": 1.0}}
    full = RunEnd(0, 1.0, {}, links={"a": 1}, deaths=[{"pid": 3}], timed_out=True).to_dict()
    assert list(full) == ["exit_code", "signal", "duration_s", "probes", "fd_handoff_s",
                          "peaks", "links", "deaths", "timed_out"]


def test_watchs_end_names_its_mode_and_its_samplers_cpu() -> None:
    end = RunEnd(1, 3.0, {"host": ProbeStatus(True)}, watch=True, sampler_cpu_s=0.25)
    assert end.to_dict() == {"exit_code": 1, "duration_s": 3.0, "probes": {"host": {"ok": True}},
                             "mode": "watch", "sampler_cpu_s": 0.25}
    assert "sampler_cpu_s" not in RunEnd(0, 1.0, {}, watch=True).to_dict()
    record = run_record(["train.py"], "train", 0.0, 0.0, **end.to_dict())
    assert record["mode"] == "watch" and record["argv"] == ["train.py"]
