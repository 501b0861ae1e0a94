"""The window asks the profiler for CUDA kernels only where the job already initialised CUDA
(in a CPU job beside a GPU, CUPTI would otherwise make a CUDA context the job never asked for),
and asks Kineto to let go of CUPTI when it stops, where that is safe."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from torch.profiler import ProfilerActivity

from doctor.probes.profiler_activities import ENV_TEARDOWN, ask_cupti_teardown, profiler_activities


def fake_torch(available: bool, initialized: bool) -> SimpleNamespace:
    return SimpleNamespace(cuda=SimpleNamespace(is_available=lambda: available,
                                                is_initialized=lambda: initialized))


@pytest.mark.parametrize(("available", "initialized", "cuda"), [
    (False, False, False),  # a CPU build
    (True, False, False),  # a CPU job on a GPU machine: never make a context for it
    (True, True, True),  # a GPU job
])
def test_cuda_is_profiled_only_in_a_job_that_uses_it(available: bool, initialized: bool,
                                                     cuda: bool) -> None:
    activities = profiler_activities(fake_torch(available, initialized))
    assert ProfilerActivity.CPU in activities
    assert (ProfilerActivity.CUDA in activities) is cuda


def cuda_build(version: str | None) -> SimpleNamespace:
    return SimpleNamespace(version=SimpleNamespace(cuda=version))


@pytest.mark.parametrize(("version", "preset", "asked"), [
    ("13.0", None, True),  # Kineto would keep CUPTI attached: every later step pays for it
    ("12.6", None, True),
    ("12.4", None, False),  # teardown crashed CUDA-graph jobs before 12.6: leave it
    ("13.0", "0", False),  # the job (or Inductor for its CUDA graphs) chose: keep its choice
    ("13.0", "1", False),
    (None, None, False),
    ("weird", None, False),
])
def test_cupti_is_let_go_after_a_cuda_window_where_it_is_safe(version: str | None,
                                                              preset: str | None,
                                                              asked: bool) -> None:
    environ = {} if preset is None else {ENV_TEARDOWN: preset}
    said = ask_cupti_teardown(cuda_build(version), [ProfilerActivity.CPU, ProfilerActivity.CUDA],
                              environ)
    assert said is asked
    assert environ.get(ENV_TEARDOWN) == ("1" if asked else preset)


def test_a_cpu_window_leaves_cupti_alone() -> None:
    environ: dict[str, str] = {}
    assert not ask_cupti_teardown(cuda_build("13.0"), [ProfilerActivity.CPU], environ)
    assert environ == {}
