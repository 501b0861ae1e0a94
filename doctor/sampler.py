"""The parent-side probes of a run (host, GPU, stacks: doctor.probes' PARENT side), sampled from
outside the job: each is created and checked, started when it can run, sampled, and stopped, and
the status of each kept for run.json.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from doctor.verdict import ProbeStatus


class ParentProbes:
    """The parent-side probes of one run: each is created and checked, started when it can run,
    ticked, and stopped; a probe that raises is stopped and marked unavailable with the error,
    and the job goes on."""

    def __init__(self, context: Any, specs: Sequence[Any]) -> None:
        self.status: dict[str, ProbeStatus] = {}
        self.running: dict[str, Any] = {}
        for spec in specs:
            try:
                probe = spec.create(context)
                self.status[spec.name] = probe.check()
                if self.status[spec.name].ok:
                    probe.start()
                    self.running[spec.name] = probe
            except Exception as err:
                self._failed(spec.name, "could not start", err)

    def _failed(self, name: str, what: str, err: BaseException) -> None:
        self.status[name] = ProbeStatus(
            False, f"{what}: {type(err).__name__}: {err}",
            "the job was not affected; the report goes on without this probe's samples")
        probe = self.running.pop(name, None)
        if probe is not None:
            try:
                probe.stop()  # keep what it sampled before it failed
            except Exception:  # already failed; the reason above is the one to report
                pass

    def sample(self) -> None:
        for name, probe in list(self.running.items()):
            try:
                probe.sample()
            except Exception as err:  # a probe failure never stops the job
                self._failed(name, "failed while sampling", err)

    def stop(self) -> dict[str, ProbeStatus]:
        """Stop every probe (each hands its samples to the store); the final status of each."""
        for name, probe in list(self.running.items()):
            try:
                probe.stop()
                self.status[name] = probe.check()
            except Exception as err:
                self.running.pop(name)
                self._failed(name, "failed to save its samples", err)
        self.running = {}
        return self.status
