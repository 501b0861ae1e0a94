"""Probes: one module per source of measurements.

A probe is a small object with ``name``, ``check()`` (never raises; a ProbeStatus that says why
the probe is off and what to do), ``start(...)`` and ``stop()``. Parent-side samplers also have
``sample(now)``; each module has a loader that turns what it wrote into a DataFrame.
Probes import nothing from the rules or the reports.
"""

from __future__ import annotations

from typing import Protocol

from doctor.verdict import ProbeStatus

__all__ = ["Probe", "ProbeStatus"]


class Probe(Protocol):
    name: str

    def check(self) -> ProbeStatus: ...

    def stop(self) -> None: ...
