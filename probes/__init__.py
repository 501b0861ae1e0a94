"""Probes: one module per source of measurements, one protocol, one registry.

A probe is a small object with ``name`` and

- ``check()``: never raises; a ProbeStatus that says why the probe is off and what to do. It
  may be asked again (after the run, for the report): the answer stays once decided, except
  where the probe changed how it runs (the stacks probe falling back to its in-process sampler);
- ``start()``: patch, hook or open what it measures;
- ``sample()``: one tick of a sampler that runs from outside the job (a no-op inside the job);
- ``stop()``: unhook, and hand what it recorded to the store.

``REGISTRY`` names every probe with the side it runs on: ``job`` probes run in each process of the
job (the bootstrap creates them for the process's Session), ``parent`` probes in the ``doctor run``
process (created for a ParentContext). Each entry names the probe's factory, imported only when
the probe is created, so that the bootstrap imports nothing it does not use. Probes import nothing
from the analysis or the reports.

``DOCTOR_PROBES_OFF`` (a bench knob: bench/overhead.py ``--probes-off``) names probes to leave
off, comma-separated (``memory,model_state``): each is created as a stand-in that reports itself
off for that reason and does nothing, so a run measures what the others cost without it.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..verdict import ProbeStatus

__all__ = ["JOB", "PARENT", "REGISTRY", "ParentContext", "Probe", "ProbeSpec", "ProbeStatus",
           "TurnedOff", "probes_of", "turned_off"]

JOB, PARENT = "job", "parent"
ENV_PROBES_OFF = "DOCTOR_PROBES_OFF"


class Probe(Protocol):
    name: str

    def check(self) -> ProbeStatus: ...

    def start(self) -> None: ...

    def sample(self) -> None: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class ParentContext:
    """What a parent-side probe is created for: the run, the job's first process, the clock and
    the run's start on it (sample times count from there, as the ledger's do)."""

    run_dir: Path
    root_pid: int
    clock: Callable[[], float]
    t0: float


@dataclass(frozen=True)
class ProbeSpec:
    name: str
    side: str  # JOB or PARENT
    factory: str  # ".module:callable" in this package, the callable taking the Session or a
    # ParentContext (relative: inside the job this package has a private name, see
    # doctor.record._bootstrap.sitecustomize)

    def create(self, context: Any) -> Probe:
        if self.name in turned_off():
            return TurnedOff(self.name)
        module, _, attr = self.factory.partition(":")
        owner: Any = importlib.import_module(module, __package__)
        for part in attr.split("."):
            owner = getattr(owner, part)
        probe: Probe = owner(context)
        return probe


REGISTRY: tuple[ProbeSpec, ...] = (
    ProbeSpec("steps", JOB, ".steps:StepsProbe"),
    ProbeSpec("dataloader", JOB, ".dataloader:DataLoaderProbe"),
    # before torch_ops: its step listener reads the faults before the window opens
    ProbeSpec("page_faults", JOB, ".page_faults:PageFaultsProbe"),
    ProbeSpec("torch_ops", JOB, ".torch_ops:DeepWindow.for_session"),
    ProbeSpec("memory", JOB, ".memory:MemoryProbe"),
    ProbeSpec("model_state", JOB, ".model_state:ModelStateProbe"),
    ProbeSpec("ddp", JOB, ".ddp:DdpProbe"),
    ProbeSpec("sharding", JOB, ".sharding:ShardingProbe"),
    ProbeSpec("pipelining", JOB, ".pipelining:PipeliningProbe"),
    ProbeSpec("gc", JOB, ".gc_pauses:GcProbe"),
    ProbeSpec("compile", JOB, ".compile:CompileProbe"),
    ProbeSpec("checkpoints", JOB, ".checkpoints:CheckpointProbe"),
    ProbeSpec("logging", JOB, ".logging_calls:LoggingProbe"),
    ProbeSpec("host", PARENT, ".host:HostSampler.for_run"),
    ProbeSpec("gpu", PARENT, ".gpu:GpuSampler.for_run"),
    ProbeSpec("stacks", PARENT, ".stacks:PySpyRecorder.for_run"),
)


def turned_off(environ: Any = None) -> frozenset[str]:
    """The probes ``DOCTOR_PROBES_OFF`` names (a bench knob; empty when unset)."""
    text = (os.environ if environ is None else environ).get(ENV_PROBES_OFF, "")
    return frozenset(name.strip() for name in text.split(",") if name.strip())


class TurnedOff:
    """What a probe named in ``DOCTOR_PROBES_OFF`` is created as: off, and says why."""

    def __init__(self, name: str) -> None:
        self.name = name

    def check(self) -> ProbeStatus:
        return ProbeStatus(False, f"turned off by {ENV_PROBES_OFF}",
                           "a bench knob; unset it to measure this probe")

    def start(self) -> None:
        pass

    def sample(self) -> None:
        pass

    def stop(self) -> None:
        pass


def probes_of(side: str) -> tuple[ProbeSpec, ...]:
    return tuple(spec for spec in REGISTRY if spec.side == side)
