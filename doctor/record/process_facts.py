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


#: The training frameworks recognised by the module of a frame that steps the optimizer (a
#: prefix of its ``__name__``), with the package whose version is recorded beside it.
FRAMEWORK_MODULES = (("transformers.trainer", "hf_trainer", "transformers"),
                     ("trl.", "hf_trainer", "transformers"),
                     ("lightning.pytorch.", "lightning", "lightning"),
                     ("pytorch_lightning.", "lightning", "pytorch_lightning"),
                     ("lightning.fabric.", "fabric", "lightning"),
                     ("lightning_fabric.", "fabric", "lightning_fabric"),
                     ("deepspeed.", "deepspeed", "deepspeed"),
                     ("accelerate.", "accelerate", "accelerate"))
MAX_FRAMES = 200  # frames walked up from the optimizer's step


def framework_facts(frame: Any) -> dict[str, Any]:
    """The framework that steps the optimizer, from the stack above ``frame`` (a frame of the
    step): the outermost framework frame is the one the job calls (the Trainer's ``train()``
    above Accelerate's optimizer wrapper), with its package's version; {} for a loop of the
    job's own. Read once per optimizer, as it first steps."""
    try:
        found = None
        for _ in range(MAX_FRAMES):
            if frame is None:
                break
            name = frame.f_globals.get("__name__") or ""
            for prefix, key, package in FRAMEWORK_MODULES:
                if name == prefix.rstrip(".") or name.startswith(prefix):
                    found = (key, package)
                    break
            frame = frame.f_back
        if found is None:
            return {}
        key, package = found
        version = getattr(sys.modules.get(package), "__version__", None)
        return {"framework": key, "framework_version": str(version) if version else None}
    except Exception:  # a fact for the fixes' wording: never a reason to fail the step
        return {}
