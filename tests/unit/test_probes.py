"""The probe protocol and registry, and what doctor run does with a probe that fails."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from doctor.probes import JOB, PARENT, REGISTRY, ParentContext, probes_of
from doctor.probes.stacks import find_py_spy
from doctor.record.session import Session
from doctor.sampler import ParentSampler
from doctor.verdict import ProbeStatus
from tests.support import FakeClock


def test_the_registry_names_every_probe_once_with_its_side() -> None:
    assert [s.name for s in probes_of(JOB)] == ["steps", "dataloader", "page_faults",
                                                "torch_ops", "memory", "model_state", "ddp",
                                                "sharding", "pipelining", "gc", "compile",
                                                "checkpoints", "logging"]
    assert [s.name for s in probes_of(PARENT)] == ["host", "gpu", "stacks"]
    assert len({s.name for s in REGISTRY}) == len(REGISTRY)


def test_every_probe_follows_the_protocol(tmp_path: Path) -> None:
    session = Session(tmp_path, rank=0, clock=FakeClock())
    context = ParentContext(tmp_path, 1, time.monotonic, time.monotonic())
    for spec in REGISTRY:
        probe = spec.create(session if spec.side == JOB else context)
        assert probe.name == spec.name
        status = probe.check()  # never raises, says why when off
        assert isinstance(status, ProbeStatus)
        assert status.ok or status.reason
        for method in ("start", "sample", "stop"):
            assert callable(getattr(probe, method))


@dataclass
class FakeProbe:
    name: str
    fail_in: str = ""
    calls: list[str] = field(default_factory=list)

    def check(self) -> ProbeStatus:
        return ProbeStatus(True)

    def start(self) -> None:
        self._step("start")

    def sample(self) -> None:
        self._step("sample")

    def stop(self) -> None:
        self.calls.append("stop")

    def _step(self, what: str) -> None:
        self.calls.append(what)
        if what == self.fail_in:
            raise RuntimeError(f"broken in {what}")


@dataclass
class FakeSpec:
    name: str
    probe: Any

    def create(self, context: Any) -> Any:
        if self.probe is None:
            raise ImportError("no such module")
        return self.probe


def test_a_probe_that_raises_is_stopped_and_marked_unavailable_and_the_rest_go_on() -> None:
    good, flaky = FakeProbe("good"), FakeProbe("flaky", fail_in="sample")
    late = FakeProbe("late", fail_in="start")
    probes = ParentSampler(None, [FakeSpec("good", good), FakeSpec("flaky", flaky),
                                 FakeSpec("late", late), FakeSpec("missing", None)])
    for _ in range(3):
        probes.sample()
    status = probes.stop()
    assert status["good"].ok and good.calls == ["start", "sample", "sample", "sample", "stop"]
    assert not status["flaky"].ok
    assert status["flaky"].reason == "failed while sampling: RuntimeError: broken in sample"
    assert flaky.calls == ["start", "sample", "stop"]  # stopped once, never sampled again
    assert status["late"].reason == "could not start: RuntimeError: broken in start"
    assert status["missing"].reason == "could not start: ImportError: no such module"
    assert all(s.hint for name, s in status.items() if name != "good")


def test_py_spy_is_found_beside_the_interpreter_without_path(monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text("")
    spy = bin_dir / "py-spy"
    spy.write_text("#!/bin/sh\n")
    spy.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert find_py_spy() == str(spy)
    spy.chmod(0o644)  # not executable: not it
    assert find_py_spy() != str(spy)
