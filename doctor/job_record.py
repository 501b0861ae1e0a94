"""The run record of a job (run.json's job part): its command, where and how it ran, and the
environment that shapes it, as ``doctor run`` and ``doctor.watch`` write it and ``doctor try``
re-runs it; secrets hidden (doctor.store.redact)."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from doctor.machine import memory_bytes, usable_cores
from doctor.store.redact import is_secret_name, redact_argv, redact_value
from doctor.version import __version__

#: The folder ``doctor run`` puts first on the job's PYTHONPATH (doctor.launch), left out of
#: the recorded one.
BOOTSTRAP_DIR = Path(__file__).resolve().parent / "record" / "_bootstrap"

#: The environment that shapes how a training job runs, kept in run.json so that doctor try
#: re-runs the job as it ran (the rest is taken from the shell doctor try runs in).
RECORDED_ENV = ("CUDA_", "NCCL_", "GLOO_", "OMP_", "MKL_", "KMP_", "OPENBLAS_", "PYTORCH_",
                "TORCH_", "TORCHINDUCTOR_", "NVIDIA_", "MASTER_", "PYTHONHASHSEED",
                "PYTHONPATH", "WORLD_SIZE", "RANK", "LOCAL_RANK", "TOKENIZERS_")


def recorded_env(env: Mapping[str, str]) -> dict[str, str]:
    """The part of ``env`` that run.json keeps: never a variable whose name looks secret
    (doctor.store.redact), and the password of a URL in a value hidden
    (``MASTER_ADDR=user:<redacted>@host``)."""
    return {k: redact_value(v) for k, v in env.items()
            if k.startswith(RECORDED_ENV) and not is_secret_name(k)}


def run_record(argv: list[str], name: str, started: float, t0: float,
               cwd: str | None = None, env: Mapping[str, str] | None = None,
               **extra: Any) -> dict[str, Any]:
    """The run.json record: the job, the machine, and (at the end) its exit and probes. Its
    ``argv`` has the values of secret-looking arguments hidden (doctor.store.redact); its
    ``env`` is the job's environment as doctor try needs it (recorded_env), before doctor's
    own variables went in."""
    job_env = recorded_env({k: v for k, v in (env or os.environ).items()
                            if not k.startswith("DOCTOR_")})
    path = job_env.get("PYTHONPATH", "").split(os.pathsep)
    if path and path[0] == str(BOOTSTRAP_DIR):
        path = path[1:]
        if path:
            job_env["PYTHONPATH"] = os.pathsep.join(path)
        else:
            job_env.pop("PYTHONPATH")
    return {
        "argv": redact_argv(argv), "name": name, "cwd": os.path.abspath(cwd or os.getcwd()),
        "env": job_env,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "t0_monotonic_s": t0, "host": socket.gethostname(), "cores": usable_cores(),
        "memory_bytes": memory_bytes(), "doctor_version": __version__,
        "python": sys.version.split()[0], **extra,
    }
