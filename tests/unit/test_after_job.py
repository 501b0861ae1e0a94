"""What doctor run measures after the job (doctor.after_job): a measurement that raises is left
out and named as the machine probe's reason; the others are kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from doctor import after_job
from doctor.record.guard import GUARD_HINT


def _fake(monkeypatch: pytest.MonkeyPatch, *, handoff: object, peaks: object) -> None:
    import doctor.probes.handoff as handoff_probe
    import doctor.probes.peaks as peaks_probe

    def give(value: object):  # type: ignore[no-untyped-def]
        def measure(*_args: object) -> object:
            if isinstance(value, BaseException):
                raise value
            return value
        return measure

    monkeypatch.setattr(handoff_probe, "fd_handoff_seconds", give(handoff))
    monkeypatch.setattr(peaks_probe, "machine_peaks", give(peaks))


def test_all_measured_is_ok_without_a_reason(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, handoff=0.002, peaks={"fp32_flops": 1e11})
    got = after_job.measure_after_job(tmp_path, {})
    assert got.fd_handoff_s == 0.002 and got.peaks == {"fp32_flops": 1e11}
    assert got.links is None  # one rank: no links to read
    assert got.status.ok and not got.status.reason


def test_a_failed_measurement_is_left_out_and_named(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, handoff=0.002, peaks=RuntimeError("GEMM timing went wrong"))
    got = after_job.measure_after_job(tmp_path, {})
    assert got.peaks is None and got.fd_handoff_s == 0.002  # the others are kept
    assert got.status.ok and got.status.hint == GUARD_HINT
    assert "roofline" in got.status.reason and "GEMM timing went wrong" in got.status.reason


def test_the_first_failure_is_the_reason(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, handoff=OSError("no /dev/shm"), peaks=ValueError("second"))
    got = after_job.measure_after_job(tmp_path, {})
    assert got.fd_handoff_s is None and got.peaks is None
    assert "no /dev/shm" in got.status.reason and "second" not in got.status.reason
