"""Model-state probe: the bytes of the parameters, gradients and optimizer state of the
optimizers the job steps, by device and dtype, measured from the tensors themselves.

The steps probe hands the Session each optimizer the first time it steps; when the profiler
window opens (steady state: the optimizer's state exists after its first step) and at exit,
this probe walks their parameter groups once: each parameter (counted once, however many groups
or optimizers hold it), its ``.grad``, and every tensor in the optimizer's ``state`` for it (Adam's
moments, its step counters). A tensor that shares storage with one already counted is counted
once. Parameters no optimizer holds (a frozen backbone) are not seen. Gradients are those that
exist at that moment: a loop that calls ``zero_grad()`` right after ``step()`` has none then
(``gradients`` absent; at the peak they are as large as the trainable parameters). Runs inside
the job, twice a run; works on CPU as on GPU. During the window's first SAVED_STEPS steps it
also counts the bytes saved for backward per step (doctor.probes.saved_tensors): the
activations.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..record.session import CLOSE, WINDOW_END, WINDOW_START, Session
from ..verdict import ProbeStatus
from .saved_tensors import SavedTensorCounter

KINDS = ("parameters", "gradients", "optimizer_state")
#: Steps of the window whose saved tensors are counted: activations are alike from step to
#: step, and a Python call per saved tensor costs a model of many small tensors up to ~1.15x
#: a step (bench/memory_cost.py), so the window's other steps go without.
SAVED_STEPS = 2


class ModelStateProbe:
    name = "model_state"

    def __init__(self, session: Session) -> None:
        self.session = session
        self.started = False
        self._states: dict[str, Any] = {}  # tag -> model_state(), into meta.json
        self._saved: SavedTensorCounter | None = None

    def check(self) -> ProbeStatus:
        try:
            import torch  # noqa: F401
        except ImportError as err:
            return ProbeStatus(False, f"torch is not importable ({err})", "")
        return ProbeStatus(True)

    def start(self) -> None:
        self.started = True
        self.session.on(WINDOW_START, self._window_start)
        self.session.on(WINDOW_END, self._window_end)
        self.session.on(CLOSE, lambda: self.record("exit"))

    def _window_start(self) -> None:
        self.record("window_start")
        if not self.started:
            return
        try:
            import torch

            params = [p for opt in self.session.optimizers for g in opt.param_groups
                      for p in g.get("params", ())]
            self._saved = SavedTensorCounter(torch, params)
            self._saved.start()
            self.session.on_step(self._on_step)
        except Exception as err:  # activations are evidence, never a reason to fail the job
            self._saved = None
            self.session.swallowed(self.name, "counting the saved tensors", err)

    def _on_step(self, _count: int) -> None:
        if self._saved is not None:
            self._saved.step()
            if len(self._saved.steps) >= SAVED_STEPS:
                self._window_end()

    def _window_end(self) -> None:
        saved, self._saved = self._saved, None
        if saved is None:
            return
        self.session.off_step(self._on_step)
        try:
            saved.stop()
            if saved.steps:
                self.session.update_meta(saved_tensors={"steps": [list(s) for s in saved.steps],
                                                        "dtypes": saved.dtypes})
        except Exception as err:  # a measurement must never fail the job
            self.session.swallowed(self.name, "keeping the saved tensors' counts", err)

    def sample(self) -> None:
        pass  # event-driven: twice a run

    def stop(self) -> None:
        self.started = False
        self._window_end()

    def record(self, tag: str) -> None:
        if not self.started or not self.session.recording:
            return
        try:
            optimizers = self.session.optimizers
            if optimizers:
                self._states[tag] = model_state(optimizers)
                self.session.update_meta(model_state=dict(self._states))
        except Exception as err:  # a measurement must never fail the job
            self.session.swallowed(self.name, "measuring the model's state", err)


def model_state(optimizers: Iterable[Any]) -> dict[str, Any]:
    """{"rows": [{kind, device, dtype, bytes, tensors}], "optimizers": [class names],
    "parameters": count} over ``optimizers``; each storage counted once."""
    seen_params: set[int] = set()
    seen_storage: set[tuple[str, int]] = set()
    totals: dict[tuple[str, str, str], list[int]] = {}
    names = []

    def add(kind: str, tensor: Any) -> None:
        try:
            key = (str(tensor.device), int(tensor.untyped_storage().data_ptr()))
        except Exception:  # a tensor without storage (meta, some subclasses): by identity
            key = ("id", id(tensor))
        if key[1] != 0 and key in seen_storage:
            return
        seen_storage.add(key)
        nbytes = int(tensor.numel()) * int(tensor.element_size())
        slot = totals.setdefault((kind, tensor.device.type, str(tensor.dtype).removeprefix(
            "torch.")), [0, 0])
        slot[0] += nbytes
        slot[1] += 1

    for opt in optimizers:
        names.append(type(opt).__name__)
        state = getattr(opt, "state", {})
        for group in getattr(opt, "param_groups", ()):
            for p in group.get("params", ()):
                if id(p) in seen_params:
                    continue
                seen_params.add(id(p))
                add("parameters", p)
                if getattr(p, "grad", None) is not None:
                    add("gradients", p.grad)
                for value in (state.get(p) or {}).values():
                    if _is_tensor(value):
                        add("optimizer_state", value)
    rows = [{"kind": k, "device": d, "dtype": t, "bytes": v[0], "tensors": v[1]}
            for (k, d, t), v in sorted(totals.items())]
    return {"rows": rows, "optimizers": names, "parameters": len(seen_params)}


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "numel") and hasattr(value, "element_size") and hasattr(value, "device")
