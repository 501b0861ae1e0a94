"""The optimizer as its own cost: an optimizer that steps each tensor in turn, taking a real
share of the step, is named with fused=True (where this torch and device run it) or
foreach=True, each with an ``apply`` for doctor try; a fused one, or a cheap one, is not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from doctor.pipeline import analyze_run
from doctor.probes.steps import optimizer_facts
from doctor.record.session import STEP_BACKWARD, Session
from tests.support import FakeClock, write_record


def loop(run_dir: Path, optimizer: dict[str, Any], optimizer_share: float,
         torch_version: str = "2.13.0+cpu", steps: int = 40) -> dict[str, Any] | None:
    clock = FakeClock()
    s = Session(run_dir, clock=clock, window_start=10**9)
    s.update_meta(optimizers=[optimizer], torch_version=torch_version)
    for _ in range(steps):
        clock.tick(0.02 * (1 - optimizer_share) / 2)
        b0 = clock()
        clock.tick(0.02 * (1 - optimizer_share) / 2)
        s.record_interval("backward", b0, clock())
        s.count_step(STEP_BACKWARD)
        s.record_optimizer_start()
        clock.tick(0.02 * optimizer_share)
        s.record_optimizer_end(0)
    s.close()
    write_record(run_dir)
    verdict = analyze_run(run_dir).verdict.to_dict()
    return next((f for f in verdict["findings"] if f["id"] == "optimizer.unfused"), None)


ADAM = {"class": "Adam", "foreach": None, "fused": None, "tensors": 400, "device": "cpu"}


def test_a_looping_adam_taking_half_the_step_is_told_fused(tmp_path: Path) -> None:
    found = loop(tmp_path, ADAM, 0.5)
    assert found is not None and found["severity"] == "warning"
    assert found["evidence"]["optimizer_share"] == pytest.approx(0.5, abs=0.02)
    assert "one tensor at a time" in found["title"]
    fused, foreach = found["fixes"]
    assert fused["code"].endswith("fused=True)") and foreach["code"].endswith("foreach=True)")
    assert found["estimated_speedup"] == pytest.approx(1 / (1 - 0.6 * 0.5), rel=0.03)


def test_an_old_torch_on_a_cpu_gets_foreach_only(tmp_path: Path) -> None:
    found = loop(tmp_path, ADAM, 0.5, torch_version="2.2.1+cpu")
    assert found is not None
    assert [f["title"] for f in found["fixes"]] == ["Adam over lists: foreach=True"]


@pytest.mark.parametrize(("optimizer", "share"), [
    ({**ADAM, "fused": True}, 0.5),  # fused already
    (ADAM, 0.05),  # cheap
    ({**ADAM, "class": "LBFGS"}, 0.5),  # nothing to fuse it with
])
def test_no_word_where_nothing_is_to_gain(tmp_path: Path, optimizer: dict, share: float) -> None:
    assert loop(tmp_path, optimizer, share) is None


def test_the_facts_are_read_from_the_optimizer() -> None:
    import torch

    params = [torch.nn.Parameter(torch.zeros(2)) for _ in range(3)]
    facts = optimizer_facts(torch.optim.AdamW(params, lr=0.1, foreach=True))
    assert facts == {"class": "AdamW", "foreach": True, "fused": None, "tensors": 3,
                     "device": "cpu"}


def test_the_collectives_inside_the_optimizer_s_step_are_not_its_update() -> None:
    """A sharded optimizer's broadcasts inside its step (phase ``optimizer``) take 0.8 of the
    window's 40 ms steps, of a 20 ms ledger step the optimizer takes 0.9 of: its update's 0.1
    gets no fused fix."""
    import pandas as pd

    from doctor.analyse.comms import RankComms
    from doctor.analyse.evidence import Evidence
    from doctor.rules.optimizer import unfused

    steps = 10
    ledger = pd.DataFrame({"wall_s": [0.02] * 40, "optimizer_s": [0.018] * 40})
    optimizers = pd.DataFrame([{"optimizer": "Adam", "device": "cpu", "tensors": 80,
                                "foreach": None, "fused": None}])

    def calls(phase: str) -> dict[int, RankComms]:
        frame = pd.DataFrame({"phase": [phase] * 40, "exposed_s": [0.008] * 40})
        return {r: RankComms(r, frame, 0.2, steps=steps) for r in (0, 1)}

    # the window's steps ran slower than the ledger's (the profiler): its shares count
    window = pd.DataFrame({"rank": [0] * 10 + [1] * 10, "dur_s": [0.04] * 20})

    def finding(comms: dict[int, RankComms] | None) -> Any:
        ev = Evidence(ledger=ledger, optimizers=optimizers, comms=comms, window=window)
        return next(iter(unfused(ev)), None)

    whole = finding(None)  # no window: the whole step of the optimizer is its update's
    assert whole is not None and whole.evidence["optimizer_share"] == pytest.approx(0.9)
    assert finding(calls("optimizer")) is None  # 0.9 - 0.8 of the step: 10 %, under 15 %
    backward = finding(calls("backward"))  # a DDP all-reduce in backward is not the step's
    assert backward is not None and backward.evidence["optimizer_share"] == pytest.approx(0.9)
