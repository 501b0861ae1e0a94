"""Shared by the GPU sample jobs: a clear exit when there is no CUDA device."""

from __future__ import annotations

import sys


def require_cuda(job: str) -> None:
    import torch

    if not torch.cuda.is_available():
        build = "a CPU-only torch build" if torch.version.cuda is None else "no visible CUDA device"
        sys.exit(f"{job}: needs a CUDA GPU, and this machine has {build} "
                 f"(torch {torch.__version__}); nothing was run")
