"""Iterations a GradScaler skipped: each is a step of its own (not merged with the next, as the
optimizer's hook alone would make it), counted, and named with its wasted time where they recur
past the scaler's calibration at the start."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from doctor.pipeline import analyze_run
from doctor.probes.steps import StepsProbe
from doctor.record.session import Session
from tests.support import FakeClock, scaled_loop


def finding(tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any] | None]:
    verdict = analyze_run(tmp_path).verdict.to_dict()
    return verdict, next((f for f in verdict["findings"] if f["id"] == "steps.skipped"), None)


def test_every_third_iteration_skipped_is_counted_and_named(tmp_path: Path) -> None:
    scaled_loop(tmp_path, 60, skip={i for i in range(60) if i % 3 == 2})
    verdict, found = finding(tmp_path)
    assert verdict["steps"]["count"] == 59  # iterations, not optimizer steps merged in pairs
    assert found is not None and found["severity"] == "warning"
    ev = found["evidence"]
    assert (ev["iterations"], ev["skipped"], ev["calibrating"]) == (60, 20, 0)
    # a skipped iteration runs all but the optimizer step: 27 ms of the stepped ones' 30
    assert ev["wasted_share"] == pytest.approx(20 * 0.027 / (20 * 0.027 + 39 * 0.03), rel=1e-3)
    assert found["estimated_speedup"] == pytest.approx(1 / (1 - ev["wasted_share"]), abs=0.01)
    assert "Find what overflows" in [f["title"] for f in found["fixes"]]


def test_the_scalers_calibration_at_the_start_is_no_finding(tmp_path: Path) -> None:
    scaled_loop(tmp_path, 80, skip=set(range(6)) | {50})
    _verdict, found = finding(tmp_path)
    assert found is None


def test_accumulation_gives_the_micro_batches(tmp_path: Path) -> None:
    scaled_loop(tmp_path, 40, skip={i for i in range(40) if i % 4 == 1}, micro_batches=4)
    verdict, found = finding(tmp_path)
    assert verdict["steps"]["count"] == 39
    assert found is not None and found["evidence"]["micro_batches"] == 4


class FakeScaler:
    def update(self) -> str:
        return "updated"


def test_the_probe_records_each_update_with_whether_the_optimizer_stepped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = Session(tmp_path, clock=FakeClock(), window_start=10**9)
    seen: list[tuple[str, int]] = []
    monkeypatch.setattr(s, "record_interval",
                        lambda name, t0, t1, key=0: seen.append((name, key)))
    probe = StepsProbe(s)
    original = FakeScaler.update
    probe._wrap_scaler_update(SimpleNamespace(amp=SimpleNamespace(GradScaler=FakeScaler)))
    scaler = FakeScaler()
    probe._stepped = True  # the optimizer's post hook fired
    assert scaler.update() == "updated"
    assert scaler.update() == "updated"  # no optimizer step since: skipped
    assert seen == [("scaler", 1), ("scaler", 0)]
    probe.stop()
    assert FakeScaler.update is original
    s.close()
