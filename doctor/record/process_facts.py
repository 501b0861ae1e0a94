"""Facts about this process of the job for its meta.json: its rank variables, the CUDA device
it used, the torch it imported (read from ``sys.modules``: never imports torch)."""

from __future__ import annotations

import os
import sys
from typing import Any


def env_int(name: str) -> int | None:
    value = os.environ.get(name)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def cuda_device() -> dict[str, Any]:
    """The CUDA device this process used (its index and uuid), where it initialised CUDA: what
    maps a rank to its GPU when NVML's process list cannot (a container's own PID namespace)."""
    torch = sys.modules.get("torch")
    try:
        if torch is None:
            return {}
        if not torch.cuda.is_initialized():
            return {"cuda_initialized": False}
        index = int(torch.cuda.current_device())
        uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", "") or "")
        return {"cuda_initialized": True, "cuda_device": index, "cuda_uuid": uuid or None}
    except Exception:  # a fact for the analysis; never a reason to fail the job's exit
        return {}


def torch_facts() -> dict[str, Any]:
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    try:
        return {"torch_version": str(torch.__version__),
                "torch_threads": int(torch.get_num_threads()),
                "cuda": bool(torch.cuda.is_available())}
    except Exception:  # facts for the report; a half-imported torch gives none
        return {}
