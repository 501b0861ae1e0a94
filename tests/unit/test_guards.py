"""Nothing degrades silently: a measurement that raises never stops the job, and its probe's
first failure is the reason in the report's probe table (verdict.json and report.html).

The tests here run no job (tests/unit); the one that does is in tests/e2e/test_guards.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from doctor.probes.memory import MemoryProbe
from doctor.probes.model_state import ModelStateProbe
from doctor.record.guard import GUARD_HINT, degraded, failure_reason
from doctor.record.session import Session
from doctor.verdict import ProbeStatus
from tests.support import SHARED_TRACES


class Unprintable(Exception):
    def __str__(self) -> str:
        raise ValueError("no")


def test_the_first_failure_is_the_reason_and_ok_stays() -> None:
    first = degraded(ProbeStatus(True), "a snapshot", RuntimeError("boom"))
    assert first == ProbeStatus(True, "a snapshot failed: RuntimeError: boom", GUARD_HINT)
    assert degraded(first, "another", KeyError("x")) is first  # said once
    off = ProbeStatus(False, "stopped: no space left on device (memory.jsonl)", "make room")
    assert degraded(off, "a snapshot", RuntimeError("boom")) is off  # its own reason stays
    assert failure_reason("x", Unprintable()) == "x failed: Unprintable"
    assert len(failure_reason("x", RuntimeError("y" * 5000))) == 300


def test_the_session_says_a_swallowed_failure_in_its_meta(tmp_path: Path) -> None:
    session = Session(tmp_path, rank=0)
    session.probe_status = {"memory": {"ok": True}}
    session.update_meta(x=1)  # the process folder exists
    session.swallowed("memory", "a snapshot", RuntimeError("boom"))
    session.swallowed("memory", "a later snapshot", RuntimeError("again"))
    meta = json.loads((session.directory / "meta.json").read_text())
    assert meta["probes"]["memory"] == {"ok": True, "hint": GUARD_HINT,
                                        "reason": "a snapshot failed: RuntimeError: boom"}
    session.swallowed("memory", "x", Unprintable())  # never raises, whatever it is handed
    session.close()


class _Optimizer:
    def __init__(self) -> None:
        self.param_groups: list[dict[str, list[object]]] = [{"params": []}]
        self.state: dict[object, object] = {}


def test_a_probe_that_raises_records_its_reason_and_returns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import doctor.probes.model_state as model_state

    def fails(optimizers: object) -> dict[str, object]:
        raise RuntimeError("pretend")

    monkeypatch.setattr(model_state, "model_state", fails)
    session = Session(tmp_path, rank=0)
    session.probe_status = {"model_state": {"ok": True}, "memory": {"ok": True}}
    session.update_meta(x=1)
    session.saw_optimizer(opt := _Optimizer())
    probe = ModelStateProbe(session)
    probe.start()
    probe.record("exit")  # returns: the job goes on
    assert session.probe_status["model_state"]["reason"] == (
        "measuring the model's state failed: RuntimeError: pretend")

    class BrokenTorch:
        class cuda:  # torch.cuda's shape
            @staticmethod
            def is_initialized() -> bool:
                raise RuntimeError("no CUDA")

    memory = MemoryProbe(session, torch_module=BrokenTorch)
    memory.started = True
    memory.snapshot("step")
    assert session.probe_status["memory"]["reason"] == (
        "a snapshot of the allocator failed: RuntimeError: no CUDA")
    del opt
    session.close()


def test_the_stack_samplers_start_in_the_job_is_guarded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import doctor.probes.stacks as stacks

    def unreadable(run_dir: Path) -> bool:
        raise OSError("pretend")

    monkeypatch.setattr(stacks, "in_process_stacks", unreadable)
    session = Session(tmp_path, rank=0)
    stacks.sample_own_stacks_if_asked(session)
    assert session.probe_status["stacks"]["reason"] == (
        "starting the in-process stack sampler failed: OSError: pretend")


def test_trace_paths_are_carried_whole_even_with_a_comma_in_a_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trace files reach the evidence as the paths they are (a tuple), never a string
    joined with ", " and split again."""
    import shutil

    from doctor import pipeline
    from doctor.store.traces import load_traces

    shared = SHARED_TRACES / "ddp_v100_rank1_of_2.json.gz"
    if not shared.is_file():
        pytest.skip("the shared traces are not beside this checkout")
    path = tmp_path / "rank1, run 2.json.gz"
    shutil.copyfile(shared, path)
    run = load_traces([path])
    assert run.record.sources == (str(path),)
    assert run.record.source == str(path)  # as the report names it
    seen: list[object] = []
    real = pipeline.build_evidence

    def spy(*args: object, **kwargs: object) -> object:
        evidence = real(*args, **kwargs)  # type: ignore[arg-type]
        seen.append(evidence.traces)
        return evidence

    monkeypatch.setattr(pipeline, "build_evidence", spy)
    pipeline.analyse(run)
    assert seen == [(str(path),)]
