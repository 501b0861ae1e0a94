"""Steps probe: step boundaries from torch.optim global hooks, ``backward()`` calls and CUDA graph
replays (``doctor.step()`` marks its own), and each GradScaler ``update()`` with whether the
optimizer stepped since the last one (a scaler that found inf/NaN gradients skips the optimizer
step: no hook fires, yet the iteration ran). With them, mixed precision (probes/amp.py): the
autocasts entered, each scaler's settings and scale, the losses that were not finite. Runs
inside the job; writes intervals through the Session.

The optimizer's interval is its own work: a closure passed to ``step`` (Lightning runs the
forward and backward of every step in one: ``optimizer.step(closure)``; LBFGS) is timed apart,
and the interval starts again as it returns. As each optimizer first steps, the framework that
steps it (the Hugging Face Trainer, Lightning, Accelerate, DeepSpeed) is read from the stack
once (doctor.record.process_facts.framework_facts)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from ..record.patches import Patches
from ..record.process_facts import framework_facts
from ..record.session import CLOSE, STEP_BACKWARD, Session
from ..verdict import ProbeStatus
from .amp import AmpWatch
from .eval_mode import watch_modes
from .overflow_watch import OverflowWatch


class StepsProbe:
    name = "steps"

    def __init__(self, session: Session) -> None:
        self.session = session
        self._handles: list[Any] = []
        self._patches = Patches()
        self._stepped = False  # an optimizer stepped since the last GradScaler update()
        self._optimizers: list[dict[str, Any]] = []  # each optimizer's facts, as it first stepped
        self._keys: dict[int, int] = {}
        self._amp: AmpWatch | None = None
        self._overflow: OverflowWatch | None = None

    def check(self) -> ProbeStatus:
        try:
            from torch.optim.optimizer import register_optimizer_step_post_hook  # noqa: F401
        except ImportError as err:
            return ProbeStatus(False, f"torch.optim has no global step hooks ({err})",
                               "upgrade to torch >= 2.0, or call doctor.step() once per step")
        return ProbeStatus(True)

    def start(self) -> None:
        import torch
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        keys = self._keys
        session = self.session

        def pre(opt: Any, args: Any, kwargs: Any) -> Any:
            session.record_optimizer_start()
            if kwargs or len(args) > 1:  # a closure, maybe (a plain step() passes neither)
                return with_timed_closure(args, kwargs, session.record_optimizer_start)
            return None

        def post(opt: Any, args: Any, kwargs: Any) -> None:
            self._stepped = True
            key = keys.get(id(opt))
            if key is None:
                key = keys[id(opt)] = len(keys)
                session.saw_optimizer(opt)
                self._optimizers.append(optimizer_facts(opt))
                session.update_meta(optimizers=self._optimizers,
                                    **framework_facts(sys._getframe(1)))
            session.record_optimizer_end(key)

        self._handles = [register_optimizer_step_pre_hook(pre),
                         register_optimizer_step_post_hook(post)]

        amp = self._amp = AmpWatch(session, torch)
        overflow = self._overflow = OverflowWatch(session, torch)
        amp.scale_fell = overflow.scale_fell
        # the values still in flight are read as the Session closes, while its rings take them
        # (the probes stop after it: a GPU job's last loss read there was lost)
        session.on(CLOSE, self._final_reads)

        def backward_ended(t0: int, args: tuple[Any, ...]) -> None:
            t1 = session.clock()
            session.record_interval("backward", t0, t1)
            session.count_step(STEP_BACKWARD)
            if args:
                amp.backward_ended(args[0], t0, t1)

        # Tensor.backward looks torch.autograd.backward up at call time
        self._wrap(torch.autograd, "backward", backward_ended)
        self._wrap_graph_replay(torch)
        self._wrap_scaler_update(torch)
        amp.wrap_autocast(self._patches)
        watch_modes(session, self._patches, torch, overflow.saw_trained)

    def _wrap_graph_replay(self, torch: Any) -> None:
        """A training step captured whole as a CUDA graph replays with no optimizer step or
        backward() in Python: each replay is recorded (the Session decides when they are the
        steps). Never touches CUDA: the class is patched, not a graph made."""
        record = self.session.record_graph_replay
        self._wrap(getattr(getattr(torch, "cuda", None), "CUDAGraph", None), "replay",
                   lambda t0, args: record(t0))

    def _wrap_scaler_update(self, torch: Any) -> None:
        """Each GradScaler ``update()`` (once per iteration, stepped or skipped): recorded with
        key 1 where an optimizer stepped since the last one, 0 where the scaler skipped it; and
        its scale (probes/amp.py: nothing waits for the GPU)."""
        session = self.session
        amp, overflow = self._amp, self._overflow

        def updated(t0: int, args: tuple[Any, ...]) -> None:
            t1 = session.clock()
            stepped = self._stepped
            session.record_interval("scaler", t0, t1, 1 if stepped else 0)
            self._stepped = False
            if overflow is not None:
                overflow.iteration_ended(stepped)
            if amp is not None and args:
                amp.updated(args[0], t1)

        torch_amp = getattr(torch, "amp", None)
        cuda_amp = getattr(getattr(torch, "cuda", None), "amp", None)
        for cls in {getattr(torch_amp, "GradScaler", None), getattr(cuda_amp, "GradScaler", None)}:
            if cls is not None and "update" in vars(cls):  # a subclass inherits the patch
                self._wrap(cls, "update", updated, amp.updating if amp is not None else None)

    def _wrap(self, cls: Any, name: str, then: Callable[[int, tuple[Any, ...]], None],
              before: Callable[[Any, int], None] | None = None) -> None:
        """``cls.name`` replaced by itself timed: ``then(t0, args)`` as each call ends (raised
        or not), with the Session's clock when it began and the call's positional arguments
        (``before(args[0], t0)`` as it begins, where given); restored at stop."""
        orig = getattr(cls, name, None)
        if cls is None or orig is None:
            return
        clock = self.session.clock

        @functools.wraps(orig)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            if before is not None and args:
                before(args[0], t0)
            try:
                return orig(*args, **kwargs)
            finally:
                then(t0, args)

        self._patches.put(cls, name, timed)

    def sample(self) -> None:
        pass  # hooks record as the job runs

    def stop(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self._patches.restore()
        self._final_reads()

    def _final_reads(self) -> None:
        """The mixed-precision watches' last reads (each once)."""
        if self._overflow is not None:
            self._overflow.stop()
        if self._amp is not None:
            self._amp.stop()


def optimizer_facts(opt: Any) -> dict[str, Any]:
    """An optimizer's class, its foreach and fused settings (None: torch's default), and its
    parameter tensors and their device (the first's), for the analysis of its cost."""
    facts: dict[str, Any] = {"class": type(opt).__name__}
    try:
        defaults = getattr(opt, "defaults", {}) or {}
        facts.update(foreach=defaults.get("foreach"), fused=defaults.get("fused"))
        params = [p for group in opt.param_groups for p in group.get("params", ())]
        facts.update(tensors=len(params), device=params[0].device.type if params else "")
    except Exception:  # facts for the report: the class alone will do
        pass
    return facts


def with_timed_closure(args: Any, kwargs: Any, then: Callable[[], None]) -> Any:
    """An optimizer step's (args, kwargs) with its closure (``step(closure)``: args[1] or
    ``closure=``) calling ``then()`` as it returns, so that the forward and backward it runs are
    not the optimizer's time; None (the step's own arguments) where it has none."""
    try:
        closure = kwargs.get("closure") if kwargs else None
        positional = closure is None and len(args) > 1
        if positional:
            closure = args[1]
    except Exception:  # arguments of a shape torch does not pass: the step runs as it is
        return None
    if not callable(closure):
        return None

    def timed(*a: Any, **k: Any) -> Any:
        try:
            return closure(*a, **k)
        finally:
            then()

    if positional:
        return (args[0], timed, *args[2:]), kwargs
    return args, {**kwargs, "closure": timed}
