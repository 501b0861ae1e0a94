"""Where gradients overflow (doctor.probes.overflow_watch), in real CPU training loops under a
GradScaler: the layer whose fp16 gradients overflow named, the hooks gone after the watch, a
failed watch leaving the job's weights as they would be without doctor; and what the watch
recorded, read back (damaged values left out), analysed and said by the steps.skipped finding."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from doctor.analyse.overflows import NotFound, Overflow, overflows
from doctor.analyse.steps import training_processes
from doctor.pipeline import analyze_run
from doctor.probes import overflow_watch
from doctor.probes.overflow_watch import CAPTURE, PERIODS, WATCH_ITERATIONS
from doctor.probes.param_names import parameter_names
from doctor.probes.steps import StepsProbe
from doctor.record.session import Session
from doctor.store import layout
from doctor.store.reader import load_run
from tests.support import scaled_loop, write_record


@pytest.fixture(autouse=True)
def no_compilation_yet() -> Any:
    """Dynamo's counters are per process: another test's compilations are not this loop's."""
    import sys

    utils = sys.modules.get("torch._dynamo.utils")
    saved = dict(utils.counters["stats"]) if utils is not None else {}
    if utils is not None:
        utils.counters["stats"].clear()
    yield
    if utils is not None:
        utils.counters["stats"].update(saved)


class Net(nn.Module):
    """inp (identity) -> mid (weights scaled down) -> relu -> out. A batch of large inputs keeps
    every activation in fp16's range but makes mid's weight gradient (its input times its
    output's gradient, summed over the batch) overflow fp16: mid, the middle layer, is where the
    gradients first overflow, and the only one."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.mid, self.out = nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 2)
        with torch.no_grad():
            self.inp.weight.copy_(torch.eye(32))
            self.inp.bias.zero_()
            self.mid.weight.mul_(1e-4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.mid(self.inp(x))))


class Boom(nn.Module):
    """A stack of four Linear layers whose third's output gradient is multiplied by inf where
    ``boom`` is set (a gradient that overflows whatever the type)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.ModuleList([nn.Linear(16, 16) for _ in range(4)])
        self.head = nn.Linear(16, 2)
        self.boom = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.encoder):
            x = torch.relu(layer(x))
            if i == 2 and self.boom:
                x.register_hook(lambda g: g * float("inf"))
        return self.head(x)


def fp16_loop(model: Net, iterations: int, big: float = 1e4) -> list[bool]:
    """Train ``model`` under CPU fp16 autocast, a batch ``big`` times larger every third
    iteration; whether each iteration stepped (the scale held)."""
    torch.manual_seed(1)
    model.train()  # the module the names are taken from (boom_loop's are found alive)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=10**6)
    stepped = []
    for i in range(iterations):
        x = torch.randn(64, 32) * (big if i % 3 == 2 else 1.0)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(x).float().pow(2).mean()
        opt.zero_grad()
        scaler.scale(loss).backward()
        before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        stepped.append(scaler.get_scale() == before)
    return stepped


def boom_loop(model: Boom, iterations: int, every: int = 3) -> None:
    torch.manual_seed(2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=10**6)
    for i in range(iterations):
        model.boom = i % every == every - 1
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(torch.randn(8, 16)).float().pow(2).mean()
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()


def under_doctor(tmp_path: Path, loop: Any) -> tuple[dict[str, Any], StepsProbe]:
    """``loop()`` under the steps probe; the process's meta.json and the probe."""
    s = Session(tmp_path, window_start=10**9)
    probe = StepsProbe(s)
    probe.start()
    try:
        loop()
    finally:
        probe.stop()
        s.close()
    write_record(tmp_path)
    [proc_dir] = [d for d, *_ in layout.process_dirs(tmp_path)]
    return dict(json.loads((proc_dir / layout.META).read_text())), probe


def hooks_on(model: nn.Module) -> int:
    return sum(len(getattr(p, "_post_accumulate_grad_hooks", None) or {})
               for p in model.parameters())


def test_the_layer_whose_fp16_gradients_overflow_is_named(tmp_path: Path) -> None:
    model = Net()
    meta, _probe = under_doctor(tmp_path, lambda: fp16_loop(model, 24))
    found = meta["overflow"]
    assert found["iterations"], found
    for it in found["iterations"]:
        assert it["first"] == {"module": "mid", "class": "Linear", "param": "weight",
                               "shape": "32x32"}
        assert it["nonfinite"] == 1 and it["then"] == []  # mid.weight alone overflowed
        assert "forward" not in it  # every output was finite
        assert it["iteration"] % 3 == 2  # the large batches
    assert hooks_on(model) == 0
    run = load_run(tmp_path)
    ranks = training_processes(run)
    [where] = overflows(run, ranks).values()
    assert isinstance(where, Overflow) and where.where == "mid (Linear)"
    assert where.first_in == where.read == len(found["iterations"])


def test_the_watch_is_bounded_and_removes_its_hooks(tmp_path: Path) -> None:
    model = Boom()
    meta, probe = under_doctor(tmp_path, lambda: boom_loop(model, 40))
    found = meta["overflow"]
    assert len(found["periods"]) == 1
    assert all(p["watched"] <= WATCH_ITERATIONS for p in found["periods"])
    assert len(found["iterations"]) == CAPTURE  # then it stopped for good
    assert [it["first"]["module"] for it in found["iterations"]] == ["encoder.2"] * CAPTURE
    assert found["iterations"][0]["then"] == ["encoder.1", "encoder.0"]
    watch = probe._overflow
    assert watch is not None and not watch.armed and watch.handles == [] and watch.off
    assert hooks_on(model) == 0
    assert meta["probes"].get("steps", {}).get("reason", "") == ""


def test_no_more_than_its_periods_are_armed(tmp_path: Path) -> None:
    """A skip every 25 iterations: each period of 20 sees none; two periods, then no more."""
    model = Boom()
    meta, _probe = under_doctor(tmp_path, lambda: boom_loop(model, 110, every=25))
    found = meta["overflow"]
    assert [p["armed_at"] for p in found["periods"]] == [24, 49][:PERIODS]
    assert [p["watched"] for p in found["periods"]] == [WATCH_ITERATIONS] * PERIODS
    assert found["iterations"] == [] and hooks_on(model) == 0


def test_the_watch_is_armed_past_the_calibration_only(tmp_path: Path) -> None:
    """Skips from the first iteration on (the scale settling): nothing armed."""
    model = Boom()
    meta, _probe = under_doctor(tmp_path, lambda: boom_loop(model, 12, every=1))
    assert "overflow" not in meta


def test_a_compiling_job_is_not_watched(tmp_path: Path) -> None:
    from torch._dynamo.utils import counters

    counters["stats"]["unique_graphs"] += 1
    model = Boom()
    meta, _probe = under_doctor(tmp_path, lambda: boom_loop(model, 12))
    assert meta["overflow"]["not_armed"].startswith("the job compiles")
    assert meta["overflow"]["periods"] == [] and hooks_on(model) == 0
    run = load_run(tmp_path)
    [where] = overflows(run, training_processes(run)).values()
    assert isinstance(where, NotFound) and where.reason.startswith("the job compiles")


def weights(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_a_failing_watch_leaves_the_jobs_weights_as_without_doctor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    bare = Net()
    clean = Net()
    clean.load_state_dict(bare.state_dict())
    failing = Net()
    failing.load_state_dict(bare.state_dict())
    stepped_bare = fp16_loop(bare, 24)

    meta, _probe = under_doctor(tmp_path / "ok", lambda: fp16_loop(clean, 24))
    assert meta["overflow"]["iterations"]

    def broken(*_args: Any) -> list[str]:
        raise RuntimeError("a watch that breaks")

    monkeypatch.setattr(overflow_watch, "_modules_after", broken)
    stepped: list[bool] = []
    meta, probe = under_doctor(tmp_path / "failing",
                               lambda: stepped.extend(fp16_loop(failing, 24)))
    assert stepped == stepped_bare
    for a, b, c in zip(weights(bare), weights(clean), weights(failing), strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)
    assert "watching where gradients overflow failed: RuntimeError" in \
        meta["probes"]["steps"]["reason"]
    assert probe._overflow is not None and probe._overflow.off
    assert hooks_on(failing) == 0


def test_a_parameter_no_module_holds_is_named_by_index_and_shape() -> None:
    model = nn.Linear(3, 4)
    loose = nn.Parameter(torch.zeros(5, 2))
    names, holder = parameter_names(torch, [model.weight, loose])
    assert holder is model
    assert names[0] == {"module": "", "class": "Linear", "param": "weight", "shape": "4x3"}
    assert names[1] == {"module": "", "class": "", "param": "#1", "shape": "5x2"}


def test_names_come_from_the_model_put_in_training_mode_else_the_outermost() -> None:
    from collections import OrderedDict

    model = Net()
    outer = nn.Sequential(OrderedDict(net=model))
    ddp_like = nn.Module()
    ddp_like.module = nn.Sequential(OrderedDict(net=Net()))
    mid = model.mid.weight
    assert parameter_names(torch, [mid], trained=model)[0][0]["module"] == "mid"
    assert parameter_names(torch, [mid])[0][0]["module"] == "net.mid"  # outer holds model
    assert outer.net is model
    other = ddp_like.module.net.mid.weight  # a wrapper's own "module." is no part of the name
    assert parameter_names(torch, [other])[0][0]["module"] == "net.mid"


OVERFLOW = {"periods": [{"armed_at": 2, "params": 10, "every": False, "watched": 9}],
            "iterations": [
                {"iteration": n, "params": 10, "nonfinite": 6,
                 "first": {"module": "encoder.2", "class": "Linear", "param": "weight",
                           "shape": "16x16"}, "then": ["encoder.1", "encoder.0"]}
                for n in (5, 8)] + [
                {"iteration": 11, "params": 10, "nonfinite": 2,
                 "first": {"module": "head", "class": "Linear", "param": "bias", "shape": "2"},
                 "then": []}]}


def skipped_finding(tmp_path: Path, overflow: dict[str, Any], **loop: Any) -> dict[str, Any]:
    scaled_loop(tmp_path, 60, skip={i for i in range(60) if i % 3 == 2}, scale=2.0**8,
                meta={"overflow": overflow}, **loop)
    verdict = analyze_run(tmp_path).verdict.to_dict()
    return next(f for f in verdict["findings"] if f["id"] == "steps.skipped")


def test_the_finding_names_the_layer_named_first_most_often(tmp_path: Path) -> None:
    found = skipped_finding(tmp_path, OVERFLOW)
    assert "the gradients first overflowed in encoder.2 (Linear), in 2 of the 3 skipped " \
           "iterations read (9 watched)" in found["title"]
    ev = found["evidence"]
    assert (ev["overflow_layer"], ev["overflow_first_in"], ev["overflow_read"]) == \
        ("encoder.2 (Linear)", 2, 3)
    assert ev["overflow_then"] == "encoder.1, encoder.0"
    first = found["fixes"][0]
    assert first["title"] == "Keep encoder.2 (Linear) in range: its gradients overflow first"
    assert "Find what overflows" not in [f["title"] for f in found["fixes"]]


def test_a_forward_that_overflows_names_no_layer(tmp_path: Path) -> None:
    """Inf losses: every gradient is inf from the loss on; the first in backward order (the
    head) is no cause, so the finding says the forward overflows and names none."""
    found = skipped_finding(tmp_path, OVERFLOW, nonfinite={i for i in range(60) if i % 3 == 2})
    assert "first overflowed" not in found["title"]
    assert found["fixes"][0]["title"] == "Find what overflows"


def test_damaged_overflow_records_are_left_out(tmp_path: Path) -> None:
    damaged = {"periods": [{"armed_at": "two", "params": 10}, "x"],
               "iterations": [{"iteration": 5, "params": None, "nonfinite": 1},
                              {"iteration": 8, "params": 10, "nonfinite": 6,
                               "first": ["not", "a", "dict"], "then": [1, None, "fc0"]},
                              7],
               "not_armed": 3}
    found = skipped_finding(tmp_path, damaged)
    ev = found["evidence"]
    # the one whole iteration is kept, its module unknown: named by what is left
    assert ev["overflow_read"] == 1 and ev["overflow_then"] == "fc0"
    assert ev["overflow_layer"] == "a parameter doctor could not name"


def test_a_watch_that_read_nothing_says_why(tmp_path: Path) -> None:
    found = skipped_finding(tmp_path, {"periods": [{"armed_at": 2, "params": 4, "watched": 20}],
                                       "iterations": []})
    assert found["evidence"]["overflow_not_found"] == "no skipped iteration read in 20 watched"
    run = load_run(tmp_path)
    [where] = overflows(run, training_processes(run)).values()
    assert isinstance(where, NotFound)


def test_a_fused_optimizer_arms_the_watch_by_the_scale(tmp_path: Path) -> None:
    """Adam(fused=True) under a scaler steps every iteration and skips inside its kernel: the
    watch arms where the scale fell, flags every watched iteration and names the layer."""
    model = Boom()

    def loop() -> None:
        torch.manual_seed(2)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=10**6)
        for i in range(30):
            model.boom = i % 3 == 2
            loss = model(torch.randn(8, 16)).float().pow(2).mean()
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()

    meta, _probe = under_doctor(tmp_path, loop)
    found = meta["overflow"]
    assert found["periods"][0]["every"] is True
    assert [it["first"]["module"] for it in found["iterations"]] == ["encoder.2"] * CAPTURE
    assert hooks_on(model) == 0


def test_flags_of_several_devices_are_merged_in_backward_order(tmp_path: Path) -> None:
    """An iteration's gradients on two devices are flagged and read apart: the first non-finite
    is the earliest in backward order over both."""
    s = Session(tmp_path, window_start=10**9)
    watch = overflow_watch.OverflowWatch(s, torch)
    watch._names = [{"module": f"layer{i}"} for i in range(6)]
    watch._take([(("backward", 5, [(0, 3), (2, 5)], 2), [True, False])])
    assert watch.captured == []  # the other device's flags not read yet
    watch._take([(("backward", 5, [(1, 4)], 2), 0.0)])
    [it] = watch.captured
    assert (it["iteration"], it["params"], it["nonfinite"]) == (5, 3, 2)
    assert it["first"] == {"module": "layer4"} and it["then"] == ["layer5"]
    s.close()


class Loud(Net):
    """Net whose mid layer's weights are 30 times larger: a batch of large inputs makes mid's
    fp16 output overflow (its input, inp's output, still fits), and the loss with it."""

    def __init__(self) -> None:
        super().__init__()
        with torch.no_grad():
            self.mid.weight.mul_(3e5)  # 1e-4 from Net, times 3e5: 30 times the init


def test_the_module_whose_fp16_output_overflows_is_named(tmp_path: Path) -> None:
    model = Loud()
    bare = Loud()
    bare.load_state_dict(model.state_dict())
    meta, _probe = under_doctor(tmp_path, lambda: fp16_loop(model, 24, big=5e3))
    stepped = fp16_loop(bare, 24, big=5e3)
    assert not all(stepped)
    found = meta["overflow"]
    assert found["iterations"], found
    for it in found["iterations"]:
        assert it["forward"] == {"module": "mid", "class": "Linear"}
    for a, b in zip(weights(model), weights(bare), strict=True):
        assert torch.equal(a, b)
    assert hooks_on(model) == 0
    assert all(not m._forward_hooks for m in model.modules())


def test_an_inf_loss_with_its_forward_layer_names_that_layer(tmp_path: Path) -> None:
    loud = {**OVERFLOW, "iterations": [
        {**it, "forward": {"module": "encoder.1", "class": "Linear"}}
        for it in OVERFLOW["iterations"]]}
    found = skipped_finding(tmp_path, loud, nonfinite={i for i in range(60) if i % 3 == 2})
    assert "the forward's outputs first turned inf/NaN in encoder.1 (Linear), in 3 of the 3 " \
           "skipped iterations read" in found["title"]
    assert "first overflowed" not in found["title"]  # the gradients' order says nothing here
    assert found["fixes"][0]["title"] == \
        "Keep encoder.1 (Linear) in range: its outputs overflow first"
    assert found["evidence"]["overflow_forward_in"] == 3
    assert "overflow_layer" not in found["evidence"]  # the head's gradients: no cause


def test_a_failing_forward_hook_never_reaches_the_jobs_forward(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = Loud()
    bare = Loud()
    bare.load_state_dict(model.state_dict())
    stepped_bare = fp16_loop(bare, 12, big=5e3)

    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("aminmax broke")

    monkeypatch.setattr(torch, "aminmax", broken)
    stepped: list[bool] = []
    meta, probe = under_doctor(tmp_path, lambda: stepped.extend(fp16_loop(model, 12, big=5e3)))
    assert stepped == stepped_bare
    for a, b in zip(weights(model), weights(bare), strict=True):
        assert torch.equal(a, b)
    assert "watching where gradients overflow failed: RuntimeError: aminmax broke" in \
        meta["probes"]["steps"]["reason"]
    assert probe._overflow is not None and probe._overflow.off
    assert hooks_on(model) == 0 and all(not m._forward_hooks for m in model.modules())
