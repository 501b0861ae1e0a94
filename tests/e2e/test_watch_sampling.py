"""doctor.watch samples the host and the GPU from a thread beside the job's, as doctor run's
parent does: the GPU through a fake NVML here (tests.fake_nvml)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

import doctor
from doctor.store.samples import read_gpu, read_gpu_info, read_gpu_procs, read_host
from tests.fake_nvml import FakeGpu, FakeNvml


def test_watch_samples_host_and_gpu_beside_the_job(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml([FakeGpu(pids=(os.getpid(),))])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    # the window off: its stack sampler would outlive the test (8 s)
    with doctor.watch(out=tmp_path / "run", window="off", report=False) as w:
        deadline = time.monotonic() + 2.5  # a few ticks of the 2 Hz sampler
        while time.monotonic() < deadline:
            time.sleep(0.05)
            doctor.step()
    assert w.run_dir is not None
    gpu = read_gpu(w.run_dir)
    assert len(gpu) >= 2 and gpu["util_pct"].eq(95.0).all()
    assert set(read_gpu_procs(w.run_dir)["pid"]) == {os.getpid()}
    assert read_gpu_info(w.run_dir)[0]["name"] == "NVIDIA H100 80GB HBM3"
    procs, _system = read_host(w.run_dir)
    assert set(procs["pid"]) == {os.getpid()}
    record = json.loads((w.run_dir / "run.json").read_text())
    assert record["probes"]["gpu"] == {"ok": True} and record["probes"]["host"] == {"ok": True}
    assert record["sampler_cpu_s"] >= 0
    assert nvml.shut


def test_a_window_watch_does_not_take_is_one_line_and_the_job_runs_unrecorded(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ran = []
    with doctor.watch(out=tmp_path / "run", window="soon", report=False) as w:
        ran.append(True)
    assert ran and w.run_dir is None and not (tmp_path / "run").exists()
    assert capsys.readouterr().err == (
        "doctor: doctor.watch's window takes START,STEPS (e.g. 8,5) or off, not 'soon'; "
        "the job runs without doctor.watch\n")


def test_watch_leaves_off_the_probes_the_bench_knob_names(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # its samplers are created from the registry, as doctor run's parent creates them
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([FakeGpu(pids=(os.getpid(),))]))
    monkeypatch.setenv("DOCTOR_PROBES_OFF", "host")
    with doctor.watch(out=tmp_path / "run", window="off", report=False) as w:
        doctor.step()
    assert w.run_dir is not None
    record = json.loads((w.run_dir / "run.json").read_text())
    assert record["probes"]["host"]["reason"] == "turned off by DOCTOR_PROBES_OFF"
    assert record["probes"]["gpu"] == {"ok": True}
    assert not (w.run_dir / "host.npz").exists()
