"""Steps probe: step boundaries from torch.optim global hooks, ``backward()`` calls and CUDA graph
replays (``doctor.step()`` marks its own). Runs inside the job; writes intervals through the
Session."""

from __future__ import annotations

import functools
from typing import Any

from ..record.session import STEP_BACKWARD, Session
from ..verdict import ProbeStatus


class StepsProbe:
    name = "steps"

    def __init__(self, session: Session) -> None:
        self.session = session
        self._handles: list[Any] = []
        self._orig_backward: Any = None
        self._orig_replay: Any = None
        self._keys: dict[int, int] = {}

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

        def pre(opt: Any, args: Any, kwargs: Any) -> None:
            session.record_optimizer_start()

        def post(opt: Any, args: Any, kwargs: Any) -> None:
            key = keys.get(id(opt))
            if key is None:
                key = keys[id(opt)] = len(keys)
                session.saw_optimizer(opt)
            session.record_optimizer_end(key)

        self._handles = [register_optimizer_step_pre_hook(pre),
                         register_optimizer_step_post_hook(post)]

        orig = torch.autograd.backward
        self._orig_backward = orig
        clock = session.clock

        @functools.wraps(orig)
        def backward(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return orig(*args, **kwargs)
            finally:
                session.record_interval("backward", t0, clock())
                session.count_step(STEP_BACKWARD)

        torch.autograd.backward = backward  # Tensor.backward looks it up at call time
        self._wrap_graph_replay(torch)

    def _wrap_graph_replay(self, torch: Any) -> None:
        """A training step captured whole as a CUDA graph replays with no optimizer step or
        backward() in Python: each replay is recorded (the Session decides when they are the
        steps). Never touches CUDA: the class is patched, not a graph made."""
        graph = getattr(getattr(torch, "cuda", None), "CUDAGraph", None)
        orig = getattr(graph, "replay", None)
        if graph is None or orig is None:
            return
        session, clock = self.session, self.session.clock

        @functools.wraps(orig)
        def replay(graph_self: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return orig(graph_self, *args, **kwargs)
            finally:
                session.record_graph_replay(t0)

        try:
            graph.replay = replay
        except (TypeError, AttributeError):  # a class that cannot be patched: no replays seen
            return
        self._orig_replay = (graph, orig)

    def sample(self) -> None:
        pass  # hooks record as the job runs

    def stop(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        if self._orig_backward is not None:
            import torch

            torch.autograd.backward = self._orig_backward
            self._orig_backward = None
        if self._orig_replay is not None:
            graph, orig = self._orig_replay
            graph.replay = orig
            self._orig_replay = None
