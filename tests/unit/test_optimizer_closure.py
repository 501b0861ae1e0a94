"""The steps probe on an optimizer stepped the way frameworks step it: a closure passed to
``optimizer.step`` (Lightning runs each step's forward and backward in one) is not the
optimizer's time, and the framework whose code stepped the optimizer is read from the stack as
it first steps (the outermost: the Trainer above Accelerate's optimizer wrapper)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from doctor.pipeline import analyze_run
from doctor.probes.steps import StepsProbe, with_timed_closure
from doctor.record.session import STEP_DATALOADER, Session
from tests.support import FakeClock, write_record

torch = pytest.importorskip("torch")


@pytest.fixture
def probed(tmp_path: Path) -> Iterator[tuple[Session, FakeClock]]:
    clock = FakeClock()
    session = Session(tmp_path, clock=clock, window_start=10**9)
    probe = StepsProbe(session)
    probe.start()
    try:
        yield session, clock
    finally:
        probe.stop()
        session.close()


def adam() -> Any:
    return torch.optim.Adam([torch.nn.Parameter(torch.zeros(4))], lr=0.1)


def closure_of(clock: FakeClock, seconds: float) -> Callable[[], Any]:
    def closure() -> Any:  # the forward and backward, as Lightning's closure runs them
        clock.tick(seconds)
        return torch.tensor(1.5)

    return closure


def test_a_closures_forward_and_backward_are_not_the_optimizers(
        tmp_path: Path, probed: tuple[Session, FakeClock]) -> None:
    session, clock = probed
    opt = adam()
    for i in range(40):
        session.count_step(STEP_DATALOADER)
        clock.tick(0.002)
        closure = closure_of(clock, 0.03)
        # by keyword, as Lightning's precision plugin passes it, and by position
        loss = opt.step(closure=closure) if i % 2 else opt.step(closure)
        assert float(loss) == 1.5  # the closure's own result
    session.close()
    write_record(tmp_path)
    ledger = analyze_run(tmp_path).ledger
    # before: the whole closure (94 % of a real Lightning step) read as the optimizer's
    assert ledger["optimizer_s"].sum() < 0.05 * ledger["wall_s"].sum()
    assert ledger["wall_s"].median() == pytest.approx(0.032, rel=0.05)


def test_a_step_without_a_closure_keeps_its_arguments() -> None:
    args, kwargs = (object(),), {"foo": 1}
    assert with_timed_closure(args, kwargs, lambda: None) is None
    assert with_timed_closure((object(), None), {}, lambda: None) is None


def _step_from(module: str, opt: Any, inner: Callable[[Any], Any] | None = None) -> None:
    """``opt`` stepped by a function whose module is ``module`` (a framework's, to the stack)."""
    namespace: dict[str, Any] = {"__name__": module}
    exec("def step(opt, inner):\n    return inner(opt) if inner else opt.step()", namespace)
    namespace["step"](opt, inner)


@pytest.mark.parametrize(("modules", "framework"), [
    (["lightning.pytorch.loops.optimization.automatic"], "PyTorch Lightning 9.9"),
    (["transformers.trainer", "accelerate.optimizer"], "Hugging Face Trainer 9.9"),
    (["accelerate.optimizer"], "Accelerate 9.9"),
    (["deepspeed.runtime.engine"], "DeepSpeed 9.9"),
    (["train"], None),  # a loop of the job's own
])
def test_the_framework_that_steps_the_optimizer_is_recorded(
        tmp_path: Path, probed: tuple[Session, FakeClock], monkeypatch: pytest.MonkeyPatch,
        modules: list[str], framework: str | None) -> None:
    for package in ("lightning", "transformers", "accelerate", "deepspeed"):
        monkeypatch.setitem(sys.modules, package, SimpleNamespace(__version__="9.9"))
    session, clock = probed
    opt = adam()
    inner = None
    for module in reversed(modules[1:]):  # the innermost framework calls opt.step
        inner = (lambda m, nxt: lambda o: _step_from(m, o, nxt))(module, inner)
    for _ in range(30):
        session.count_step(STEP_DATALOADER)
        clock.tick(0.01)
        _step_from(modules[0], opt, inner)
    session.close()
    write_record(tmp_path)
    assert analyze_run(tmp_path).verdict.job.get("framework") == framework

