"""The run record (run.json), built here for both doors: its job part (the command, where and
how it ran, and the environment that shapes it, as ``doctor try`` re-runs it; secrets hidden,
doctor.store.redact) and, once the job ended, how it ended (RunEnd). doctor.store.rundir writes
it (stamped with the format) and reads it back (checking the format)."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from doctor.machine import memory_bytes, usable_cores
from doctor.store.redact import is_secret_name, redact_argv, redact_value
from doctor.verdict import ProbeStatus
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


@dataclass(frozen=True)
class RunEnd:
    """How the run ended, the part of run.json written after the job: doctor run's (the job's
    status as a shell reports it and its signal, and what the parent measured after it) or
    doctor.watch's. ``sampler_cpu_s``: the CPU seconds doctor's own sampling used while the job
    ran (doctor run's whole process; doctor.watch's sampler thread): its always-on cost."""

    exit_code: int
    duration_s: float
    probes: Mapping[str, ProbeStatus]
    signal: int | None = None
    fd_handoff_s: float | None = None
    peaks: dict[str, Any] | None = None
    links: dict[str, Any] | None = None
    deaths: Sequence[dict[str, Any]] = ()
    timed_out: bool = False
    watch: bool = False
    sampler_cpu_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """run.json's keys, in its order; those a door does not measure left out."""
        out: dict[str, Any] = {"exit_code": self.exit_code}
        if not self.watch:
            out["signal"] = self.signal
        out["duration_s"] = self.duration_s
        out["probes"] = {name: s.to_dict() for name, s in self.probes.items()}
        if self.watch:
            out["mode"] = "watch"
            if self.sampler_cpu_s is not None:
                out["sampler_cpu_s"] = self.sampler_cpu_s
            return out
        out["fd_handoff_s"], out["peaks"] = self.fd_handoff_s, self.peaks
        if self.links:
            out["links"] = self.links
        if self.deaths:
            out["deaths"] = list(self.deaths)
        if self.timed_out:
            out["timed_out"] = True
        if self.sampler_cpu_s is not None:
            out["sampler_cpu_s"] = self.sampler_cpu_s
        return out
