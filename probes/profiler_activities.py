"""What the deep window (doctor.probes.torch_ops) profiles, and how Kineto lets go of CUPTI when
it stops: the CPU always, CUDA only where the job already initialised it; CUPTI's teardown asked
where the CUDA is new enough for it to be safe."""

from __future__ import annotations

import os
from typing import Any


def profiler_activities(torch: Any) -> list[Any]:
    """What the window profiles: the CPU, and CUDA only where the job already initialised it.
    Asking CUPTI for kernels in a CPU job would make a CUDA context (a GiB of the GPU's memory,
    and a GPU job in the analysis) that the job never asked for."""
    from torch.profiler import ProfilerActivity

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        activities.append(ProfilerActivity.CUDA)
    return activities


#: Kineto leaves CUPTI attached after the profiler stops unless this is "1": on an H200 (torch
#: 2.11, CUDA 13) every step after a window of a launch-bound job then took 1.37x, for the rest
#: of the run. Kineto reads it when the trace stops (pytorch#144455, kineto#1264).
ENV_TEARDOWN = "TEARDOWN_CUPTI"
#: Before CUDA 12.6 a CUPTI torn down crashed jobs that use CUDA graphs (torch's own Inductor
#: turns teardown off for them); from 12.6 it is safe, and Kineto's own default there.
TEARDOWN_SAFE_FROM = (12, 6)


def ask_cupti_teardown(torch: Any, activities: list[Any],
                       environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Before a window that profiles CUDA: ask Kineto to let go of CUPTI when it stops, so the
    steps after the window run as fast as without doctor. Not where the job (or torch for it)
    already chose, and not on a CUDA older than TEARDOWN_SAFE_FROM. True where asked."""
    if ENV_TEARDOWN in environ or not any("CUDA" in str(a) for a in activities):
        return False
    version = getattr(getattr(torch, "version", None), "cuda", None) or ""
    try:
        major_minor = tuple(int(part) for part in str(version).split(".")[:2])
    except ValueError:
        return False
    if len(major_minor) < 2 or major_minor < TEARDOWN_SAFE_FROM:
        return False
    environ[ENV_TEARDOWN] = "1"
    return True
