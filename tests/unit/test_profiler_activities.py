"""The window asks the profiler for CUDA kernels only where the job already initialised CUDA:
in a CPU job beside a GPU, CUPTI would otherwise make a CUDA context the job never asked for."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from torch.profiler import ProfilerActivity

from doctor.probes.torch_ops import profiler_activities


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
