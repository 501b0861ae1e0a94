"""What ``doctor run`` measures of the machine once the job has exited, so that it costs the
job nothing: the cost of handing a tensor from a DataLoader worker (doctor.probes.handoff), the
machine's roofline (doctor.probes.peaks, measured once per machine, then read from its cache)
and, after a job with several ranks, the links between them (doctor.probes.links).

Each is evidence for one estimate, never a reason to fail the run: one that raises is left out,
and its failure becomes the reason of the ``machine`` probe's status (doctor.record.guard), so
the report's probe table says why an estimate went without it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from doctor.record.guard import degraded
from doctor.verdict import ProbeStatus

PROBE = "machine"  # the name of its status in run.json's probes

T = TypeVar("T")


@dataclass(frozen=True)
class AfterJob:
    """What was measured after the job (None: not measured, or its measurement failed), and the
    ``machine`` probe's status."""

    fd_handoff_s: float | None
    peaks: dict[str, Any] | None
    links: dict[str, Any] | None
    status: ProbeStatus


def measure_after_job(run_dir: Path, env: Mapping[str, str]) -> AfterJob:
    """The three measurements of the module docstring, each guarded."""
    from doctor.probes.handoff import fd_handoff_seconds
    from doctor.probes.links import links
    from doctor.probes.peaks import machine_peaks
    from doctor.store.reader import job_world_size

    status = ProbeStatus(True)

    def guarded(what: str, measure: Callable[[], T]) -> T | None:
        nonlocal status
        try:
            return measure()
        except Exception as err:  # evidence for one estimate: the run goes on without it
            status = degraded(status, what, err)
            return None

    handoff = guarded("timing the DataLoader worker handoff", fd_handoff_seconds)
    peaks = guarded("measuring the machine's roofline", machine_peaks)
    found = guarded("reading the links between ranks",
                    lambda: links(env) if job_world_size(run_dir) > 1 else None)
    return AfterJob(handoff, peaks, found, status)
