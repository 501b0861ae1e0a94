"""A job that computed on the CPU beside the machine's idle GPUs (doctor.rules.idle_gpus): named,
critical, with the fix its torch's own word points at. Recorded loops beside a fake NVML."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from doctor.pipeline import analyze_run
from doctor.store import layout
from doctor.verdict import Verdict
from tests.fake_nvml import FakeGpu, FakeNvml, const, mark_cuda, sample_run
from tests.support import record_loop, write_record


def say_cuda(run_dir: Path, available: bool | None) -> None:
    """Each training process's meta.json as torch left it: CUDA available or not, never
    initialised (None: a process that said nothing of CUDA)."""
    for proc_dir, _rank, role, _pid in layout.process_dirs(run_dir):
        if role.startswith("worker"):
            continue
        meta_path = proc_dir / layout.META
        meta = json.loads(meta_path.read_text())
        meta.pop("cuda", None)
        if available is not None:
            meta.update(cuda=available, cuda_initialized=False)
        meta_path.write_text(json.dumps(meta))


def cpu_job_beside(tmp_path: Path, gpus: list[FakeGpu], available: bool | None,
                   **record: object) -> Verdict:
    record_loop(tmp_path, 60, wait_s=0.001, compute_s=0.05)
    say_cuda(tmp_path, available)
    write_record(tmp_path, cores=16, **record)
    sample_run(tmp_path, FakeNvml(gpus), seconds=3.0, hz=10)
    return analyze_run(tmp_path).verdict


def unused(verdict: Verdict) -> dict | None:
    return next((f for f in verdict.to_dict()["findings"] if f["id"] == "gpu.unused"), None)


def test_a_cpu_build_beside_an_idle_gpu_is_critical_and_says_install_a_cuda_build(
        tmp_path: Path) -> None:
    verdict = cpu_job_beside(tmp_path, [FakeGpu(util=const(0.0))], available=False)
    found = unused(verdict)
    assert found is not None and found["severity"] == "critical"
    assert found["evidence"]["torch_cuda_available"] is False
    assert [f["title"] for f in found["fixes"]] == ["Install a CUDA build of torch"]
    assert verdict.bottleneck == "compute"  # the verdict is still the job's own


def test_a_gpu_torch_sees_but_the_model_never_used_says_move_it(tmp_path: Path) -> None:
    found = unused(cpu_job_beside(tmp_path, [FakeGpu(util=const(0.0))] * 2, available=True))
    assert found is not None and found["severity"] == "critical"
    assert "2 GPUs" in found["title"]
    assert [f["title"] for f in found["fixes"]] == ["Move the model and each batch to the GPU"]


def test_unsaid_gives_both_fixes_and_how_to_tell(tmp_path: Path) -> None:
    found = unused(cpu_job_beside(tmp_path, [FakeGpu(util=const(0.0))], available=None))
    assert found is not None
    assert "torch.cuda.is_available()" in found["fixes"][0]["code"]
    assert len(found["fixes"]) == 3


def test_gpus_hidden_on_purpose_are_only_said(tmp_path: Path) -> None:
    found = unused(cpu_job_beside(tmp_path, [FakeGpu(util=const(0.0))], available=False,
                                  env={"CUDA_VISIBLE_DEVICES": ""}))
    assert found is not None and found["severity"] == "info"
    assert "CUDA_VISIBLE_DEVICES" in found["title"]


def test_a_gpu_busy_with_something_else_is_not_the_jobs_idle_gpu(tmp_path: Path) -> None:
    assert unused(cpu_job_beside(tmp_path, [FakeGpu(util=const(80.0))], available=True)) is None


@pytest.mark.parametrize("gpus", [0, 1])
def test_a_gpu_job_or_a_machine_without_gpus_gets_no_word(tmp_path: Path, gpus: int) -> None:
    record_loop(tmp_path, 60, wait_s=0.001, compute_s=0.05)
    if gpus:
        mark_cuda(tmp_path)
    write_record(tmp_path, cores=16)
    if gpus:
        sample_run(tmp_path, FakeNvml([FakeGpu(util=const(0.0))]), seconds=3.0, hz=10)
    assert unused(analyze_run(tmp_path).verdict) is None


def test_a_job_that_died_before_its_first_step_gets_no_word(tmp_path: Path) -> None:
    """Nothing computed, on the CPU or anywhere: a GPU job that failed at start-up is no CPU job."""
    record_loop(tmp_path, 0)
    say_cuda(tmp_path, True)
    write_record(tmp_path, cores=16)
    sample_run(tmp_path, FakeNvml([FakeGpu(util=const(0.0))]), seconds=3.0, hz=10)
    assert unused(analyze_run(tmp_path).verdict) is None
