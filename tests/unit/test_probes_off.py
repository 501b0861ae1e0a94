"""The bench knob DOCTOR_PROBES_OFF (issue 32, item 11): a probe it names is created as a
stand-in that is off, says why, and patches nothing; the others start as usual."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from doctor.bootstrap import JobProbes
from doctor.probes import ENV_PROBES_OFF, JOB, TurnedOff, probes_of, turned_off
from doctor.record.session import Session


def test_turned_off_reads_the_names() -> None:
    assert turned_off({ENV_PROBES_OFF: " memory, model_state ,"}) == {"memory", "model_state"}
    assert turned_off({}) == frozenset()


def test_a_probe_named_is_off_and_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    pytest.importorskip("torch")
    monkeypatch.setenv(ENV_PROBES_OFF, "steps")
    import torch

    before = torch.autograd.backward
    session = Session(tmp_path, rank=0)
    probes = JobProbes(session)
    probes.start()
    try:
        status = session.probe_status
        assert status["steps"]["ok"] is False
        assert ENV_PROBES_OFF in status["steps"]["reason"]
        assert torch.autograd.backward is before  # the steps probe patched nothing
        assert status["dataloader"]["ok"] is True
        assert not any(isinstance(p, TurnedOff) for p in probes.probes)
        assert {spec.name for spec in probes_of(JOB)} >= set(status)
    finally:
        probes.close()
    assert "torch" in sys.modules
