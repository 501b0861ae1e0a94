"""The parent-side sampler of both doors (doctor.sampler), driven by a fake clock: no sleeps."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from doctor.sampler import ParentSampler
from doctor.verdict import ProbeStatus


class Clock:
    """Seconds that move only when told: a wait moves it by the time waited."""

    def __init__(self) -> None:
        self.now = 100.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    def waiter(self, ticks: int) -> Any:
        """A wait that lets ``ticks`` ticks through, then says stop."""
        def wait(seconds: float) -> bool:
            self.waits.append(seconds)
            if len(self.waits) > ticks:
                return True
            self.now += seconds
            return False
        return wait


@dataclass
class TimedProbe:
    name: str
    clock: Clock
    cost_s: float = 0.0  # how long one sample takes, on the clock
    fail_at: int | None = None  # the sample (0-based) that raises
    times: list[float] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)

    def check(self) -> ProbeStatus:
        return ProbeStatus(True)

    def start(self) -> None:
        self.calls.append("start")

    def sample(self) -> None:
        self.calls.append("sample")
        self.times.append(self.clock.now - 100.0)
        self.clock.now += self.cost_s
        if self.fail_at is not None and len(self.times) - 1 == self.fail_at:
            raise OSError("NVML went away")

    def stop(self) -> None:
        self.calls.append("stop")


@dataclass
class Spec:
    name: str
    probe: Any

    def create(self, context: Any) -> Any:
        return self.probe


def test_ticks_fall_on_the_interval_however_long_sampling_takes() -> None:
    clock = Clock()
    probe = TimedProbe("host", clock, cost_s=0.125)
    sampler = ParentSampler(None, [Spec("host", probe)], interval_s=0.5, clock=clock)
    sampler.run(clock.waiter(ticks=5))
    assert probe.times == [0.0, 0.5, 1.0, 1.5, 2.0]  # no drift by the 0.125 s of each sample
    assert clock.waits[1:] == [0.375] * 5


def test_a_sampler_that_fell_behind_skips_ahead_rather_than_bursting() -> None:
    clock = Clock()
    slow = TimedProbe("gpu", clock, cost_s=1.25)  # longer than a tick
    sampler = ParentSampler(None, [Spec("gpu", slow)], interval_s=0.5, clock=clock)
    sampler.run(clock.waiter(ticks=3))
    assert slow.times == [0.0, 1.75, 3.5]  # each the interval after the late one ended
    assert clock.waits == [0.0, 0.5, 0.5, 0.5]


def test_every_nth_tick_and_the_rest_on_each() -> None:
    clock = Clock()
    host, gpu = TimedProbe("host", clock), TimedProbe("gpu", clock)
    sampler = ParentSampler(None, [Spec("host", host), Spec("gpu", gpu)], interval_s=0.5,
                            clock=clock, every={"host": 2})
    sampler.run(clock.waiter(ticks=5))
    assert gpu.times == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert host.times == [0.0, 1.0, 2.0]  # 1 Hz


def test_a_probe_that_raises_is_stopped_once_with_its_reason_and_the_others_go_on() -> None:
    clock = Clock()
    flaky = TimedProbe("gpu", clock, fail_at=1)
    steady = TimedProbe("host", clock)
    ticked: list[int] = []
    sampler = ParentSampler(None, [Spec("gpu", flaky), Spec("host", steady)], interval_s=0.5,
                            clock=clock)
    sampler.run(clock.waiter(ticks=4), after_tick=lambda: ticked.append(sampler.ticks))
    assert flaky.calls == ["start", "sample", "sample", "stop"]  # stopped at once, once
    assert "gpu" not in sampler.running
    assert steady.times == [0.0, 0.5, 1.0, 1.5]
    assert ticked == [1, 2, 3, 4]
    status = sampler.stop()
    assert flaky.calls.count("stop") == 1 and steady.calls[-1] == "stop"
    assert status["gpu"] == ProbeStatus(
        False, "failed while sampling: OSError: NVML went away",
        "the job was not affected; the report goes on without this probe's samples")
    assert status["host"].ok


def test_abandoned_probes_are_not_stopped_and_say_why() -> None:
    clock = Clock()
    stuck, broken = TimedProbe("gpu", clock), TimedProbe("host", clock, fail_at=0)
    sampler = ParentSampler(None, [Spec("gpu", stuck), Spec("host", broken)], clock=clock)
    sampler.sample()
    status = sampler.abandon("its sampler did not stop in time; its samples were left out")
    assert "stop" not in stuck.calls and not sampler.running
    assert status["gpu"].reason == "its sampler did not stop in time; its samples were left out"
    assert status["host"].reason.startswith("failed while sampling")  # its own reason stays
