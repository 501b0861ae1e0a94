"""doctor.watch samples the host and the GPU from a thread beside the job's, as doctor run's
parent does: the GPU through a fake NVML here (tests.fake_nvml).

The tests here run no job, process nor clock (tests/unit); those that do are in
tests/e2e/test_watch_sampling.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import doctor
from tests.fake_nvml import FakeNvml


def test_watch_says_why_it_has_no_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([]))
    with doctor.watch(out=tmp_path / "run", report=False) as w:
        doctor.step()
    assert w.run_dir is not None
    record = json.loads((w.run_dir / "run.json").read_text())
    assert record["probes"]["gpu"]["reason"] == "NVML found no GPU"
    assert not (w.run_dir / "gpu.npz").exists()
