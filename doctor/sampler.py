"""The parent-side sampler of a run: the probes that watch the job from outside its training
code (host, GPU, stacks: doctor.probes' PARENT side), for both doors. ``doctor run`` runs it in
its own process while it waits for the job (doctor.launch); ``doctor.watch`` in one thread
beside the job's (doctor.watch).

Each probe is created and checked, started when it can run, sampled on every tick (or every
Nth: ``every``), and stopped, and the status of each is kept for run.json. A probe that raises
is stopped once (what it sampled is kept), marked unavailable with the error, and never sampled
again; the job and the other probes go on. The ticks are drift-free: they fall at t0, t0 + I,
t0 + 2I ... on the sampler's clock however long a tick's sampling takes, and a sampler that fell
behind (a suspended laptop, a loaded host) skips ahead rather than catching up in a burst. The
clock, and the wait between ticks, are the caller's, so a test drives it with a fake clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from doctor.store.samples import SAMPLE_INTERVAL_S
from doctor.verdict import ProbeStatus

NOT_AFFECTED = "the job was not affected; the report goes on without this probe's samples"


class ParentSampler:
    """The parent-side probes of one run and their drift-free loop (see the module docstring).

    ``interval_s`` is the time between ticks on ``clock``; ``every`` samples the named probes on
    one tick of N only (doctor.watch's host: every other tick)."""

    def __init__(self, context: Any, specs: Sequence[Any], *,
                 interval_s: float = SAMPLE_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic,
                 every: Mapping[str, int] | None = None) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self.every = dict(every or {})
        self.ticks = 0  # ticks sampled so far
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
        self.status[name] = ProbeStatus(False, f"{what}: {type(err).__name__}: {err}",
                                        NOT_AFFECTED)
        probe = self.running.pop(name, None)
        if probe is not None:
            try:
                probe.stop()  # keep what it sampled before it failed
            except Exception:  # already failed; the reason above is the one to report
                pass

    def sample(self) -> None:
        """One tick: sample each running probe that is due on it."""
        for name, probe in list(self.running.items()):
            if self.ticks % self.every.get(name, 1):
                continue
            try:
                probe.sample()
            except Exception as err:  # a probe failure never stops the job
                self._failed(name, "failed while sampling", err)
        self.ticks += 1

    def run(self, wait: Callable[[float], bool],
            after_tick: Callable[[], None] | None = None) -> None:
        """Sample on every tick, the first at once, until ``wait(seconds)`` says to stop: it
        waits up to ``seconds`` (the time left until the next tick is due) and returns True to
        stop (the job ended; the door closes). ``after_tick`` runs after each tick's sampling
        (doctor run's progress lines)."""
        due = self.clock()
        while not wait(max(0.0, due - self.clock())):
            self.sample()
            if after_tick is not None:
                after_tick()
            due += self.interval_s
            if due < self.clock():  # fell behind: skip ahead, never catch up in a burst
                due = self.clock() + self.interval_s

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

    def abandon(self, reason: str) -> dict[str, ProbeStatus]:
        """Give up the running probes without stopping them (the loop is stuck inside one of
        them, e.g. an NVML call on a bad GPU: stopping would free what it is using); each is
        marked unavailable with ``reason``. The final status of each."""
        for name in list(self.running):
            self.status[name] = ProbeStatus(False, reason, NOT_AFFECTED)
        self.running = {}
        return self.status
