"""Where gradients overflow: once a GradScaler has skipped an iteration past its calibration, a
few iterations are watched to name the parameters (and so the layers) whose gradients were first
inf or NaN in the backward pass of a skipped iteration.

Armed by the steps probe (probes/steps.py) at a GradScaler ``update()`` that ended a skipped
iteration (no optimizer stepped) after at least one that stepped, or where the scale fell while
the optimizer stepped (a fused optimizer skips inside its kernel). Armed, each watched parameter
(the stepped optimizers' parameters that require grad, up to MAX_PARAMS) carries a
``register_post_accumulate_grad_hook`` that appends its index to a list: the order in which the
backward pass accumulated the gradients, and nothing else (no tensor op, read-only). At the
update that ends a watched iteration the scaler skipped, each gradient's largest magnitude is
taken on its device (``torch._foreach_norm(grads, inf)``: inf or NaN where any element is) and
stacked into one flag per parameter, read at once on a CPU or, on a GPU, copied non-blocking
behind a CUDA event and read at a later update once the event has passed (nothing waits). The
first parameter in backward order whose gradient was not finite names the layer where the
overflow began: the layers after it in backward order (before it in the forward) take inf/NaN
from it.

Bounded: a period lasts WATCH_ITERATIONS updates or until CAPTURE skipped iterations were read,
at most PERIODS periods a run; every hook is removed at the period's end (the handles are
kept). Not armed, it costs the steps probe one attribute test per update. Never armed where the
job compiles (hooks on a compiled model's parameters could make Dynamo compile again). Names
come from the nn.Module that holds the parameters, found once per period
(doctor.probes.param_names); a parameter no module holds is named by its index and shape. Any
failure turns the watch off, removes its hooks and is said once in the steps probe's status;
nothing here changes a value, a graph or an exception of the job. Recorded in the process's
meta (``overflow``).
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

from ..record.late_reads import LateReads, capturing
from ..record.session import Session
from .output_watch import OutputWatch
from .param_names import parameter_names

WATCH_ITERATIONS = 20  # iterations (scaler updates) a period watches at most
CAPTURE = 3  # skipped iterations read, in all, before the watch stops for good
PERIODS = 2  # periods a run at most
MAX_PARAMS = 4096  # parameters watched (beyond them: not hooked, said in the meta)
MAX_ORDER = 1 << 16  # gradients' accumulations kept per iteration
BAD_NAMED = 8  # non-finite parameters named per iteration, in backward order


class OverflowWatch:
    """What the steps probe calls: ``iteration_ended(stepped)`` after each GradScaler update,
    ``scale_fell()`` where a scale read lower than the last, ``stop()`` at the end."""

    def __init__(self, session: Session, torch: Any) -> None:
        self.session = session
        self._torch = torch
        self.off = False  # a failure or a compiled job stopped it for good
        self.armed = False
        self.periods: list[dict[str, Any]] = []  # each period: when armed, how long, params
        self.captured: list[dict[str, Any]] = []  # each skipped iteration read
        self.handles: list[Any] = []
        self._updates = 0  # scaler updates seen
        self._clean = False  # an update that stepped was seen (past the calibration)
        self._every = False  # flags at every watched update (a fused optimizer)
        self._left = 0
        self._params: list[Any] = []
        self._names: list[dict[str, Any]] = []
        self._order: list[int] = []
        self._reads = LateReads(torch)
        self._partial: dict[tuple[str, int], list[Any]] = {}  # flags read, device by device
        self._outputs = OutputWatch(torch)
        self._forward: dict[int, dict[str, Any] | None] = {}  # iteration -> first output bad
        self._trained: Any = None  # a weak reference to the module last put in training mode
        self._trained_id = 0

    def saw_trained(self, module: Any) -> None:
        """The job called ``module.train()`` (doctor.probes.eval_mode): kept weakly, for the
        parameters' names."""
        if id(module) != self._trained_id:
            try:
                self._trained, self._trained_id = weakref.ref(module), id(module)
            except TypeError:  # a module that takes no weak reference: named another way
                pass

    # ----- what the steps probe calls ----------------------------------------------------
    def iteration_ended(self, stepped: bool) -> None:
        """A GradScaler update ended an iteration whose optimizer stepped or not."""
        if self.off:
            return
        self._updates += 1
        if not self.armed and not self._reads.pending:
            if stepped:
                self._clean = True
            elif self._clean:
                self._arm(every=False)
            return
        try:
            if self.armed:
                if not stepped or self._every:
                    self._output_flags()
                    self._flags()
                self._outputs.clear()
                self._order.clear()  # the list the hooks append to
                self._left -= 1
            self._read()
            if self.armed and (self._left <= 0 or len(self.captured) >= CAPTURE):
                self._disarm()
        except Exception as err:
            self._fail(err)

    def scale_fell(self) -> None:
        """A scale read lower than the last while the watch is not armed: armed to flag every
        update (the optimizer may skip inside its kernel)."""
        if not self.off and not self.armed and self._clean:
            self._arm(every=True)

    def stop(self) -> None:
        """The hooks removed; the reads in flight taken once landed (waited for briefly);
        never armed again."""
        if self.armed:
            self._disarm()
        try:
            if self._reads.pending:
                self._take(self._reads.final())
        except Exception as err:
            self._fail(err)
        self.off = True

    # ----- arming ------------------------------------------------------------------------
    def _arm(self, every: bool) -> None:
        if len(self.periods) >= PERIODS or len(self.captured) >= CAPTURE:
            return
        try:
            if _compiles():
                self.off = True
                self._say(not_armed="the job compiles: hooks on its parameters could make "
                                    "torch.compile compile again")
                return
            params, total = _watched(self.session.optimizers)
            if not params:
                return
            trained = self._trained() if self._trained is not None else None
            names, model = parameter_names(self._torch, params, trained)
            order = self._order = []  # cleared, never replaced, while armed

            def hooked(i: int) -> Any:
                def accumulated(_param: Any) -> None:
                    if len(order) < MAX_ORDER:
                        order.append(i)
                return accumulated

            self._params, self._names = params, names
            self.armed, self._every, self._left = True, every, WATCH_ITERATIONS
            self.periods.append({"armed_at": self._updates - 1, "params": len(params),
                                 "every": every, "watched": 0,
                                 **({"of_params": total} if total > len(params) else {})})
            for i, p in enumerate(params):
                self.handles.append(p.register_post_accumulate_grad_hook(hooked(i)))
            if model is not None:
                self._outputs.arm(model)
                self.periods[-1]["modules"] = len(self._outputs.handles)
            self._say()
        except Exception as err:
            self._fail(err)

    def _disarm(self) -> None:
        try:
            self._outputs.disarm()
        except Exception as err:  # said; the gradients' hooks are still removed
            self.session.swallowed("steps", "removing a forward hook", err)
        handles, self.handles = self.handles, []
        for h in handles:
            try:
                h.remove()
            except Exception as err:  # said; the others are still removed
                self.session.swallowed("steps", "removing a gradient hook", err)
        if self.armed and self.periods:
            self.periods[-1]["watched"] = WATCH_ITERATIONS - self._left
        self.armed = False
        self._params = []  # the watch keeps no tensor of the job's past its period
        self._order = []
        self._say()

    def _fail(self, err: BaseException) -> None:
        self.off = True
        self._disarm()
        self.session.swallowed("steps", "watching where gradients overflow", err)

    # ----- flags -------------------------------------------------------------------------
    def _output_flags(self) -> None:
        """One flag per module output of this iteration (in the order the forwards ended),
        per device, put to be read late before the gradients' flags."""
        groups = self._outputs.flags()
        for pairs, finite in groups:
            self._take(self._reads.put(finite, ("forward", self._updates - 1, pairs,
                                                len(groups))))

    def _flags(self) -> None:
        """One flag per gradient accumulated this iteration (in backward order), per device:
        finite or not, computed on the device, put to be read late."""
        torch = self._torch
        by_device: dict[Any, tuple[list[tuple[int, int]], list[Any]]] = {}
        for position, i in enumerate(dict.fromkeys(self._order)):
            g = self._params[i].grad
            if g is None or type(g) is not torch.Tensor or g.is_sparse:
                continue  # a DTensor's largest value would be a collective: not watched
            pairs, grads = by_device.setdefault(g.device, ([], []))
            pairs.append((position, i))
            grads.append(g.detach())
        if any(d.type == "cuda" for d in by_device) and capturing(torch):
            return  # a step captured into a CUDA graph: no kernel of the watch joins it
        for pairs, grads in by_device.values():
            norms = torch._foreach_norm(grads, float("inf"))
            finite = torch.isfinite(torch.stack([n.float() for n in norms]))
            tag = ("backward", self._updates - 1, pairs, len(by_device))
            self._take(self._reads.put(finite, tag))
        if self._reads.off:
            raise RuntimeError("the flags could not be read (doctor.record.late_reads)")

    def _read(self) -> None:
        """The flags that have landed (none waited for)."""
        if self._reads.pending:
            self._take(self._reads.ready())

    def _take(self, ready: list[tuple[Any, Any]]) -> None:
        """Each iteration read with a gradient that was not finite, captured with its first
        such parameter (in backward order)."""
        for (kind, update, pairs, devices), flags in ready:
            part = self._partial.setdefault((kind, update), [0, 0, []])  # devices, flags, bad
            part[0] += 1
            part[1] += len(pairs)
            part[2] += [pi for pi, ok in zip(pairs, _listed(flags), strict=True) if not ok]
            if part[0] < devices:
                continue
            del self._partial[(kind, update)]
            bad = [i for _position, i in sorted(part[2])]
            if kind == "forward":
                names = self._outputs.names
                self._forward[update] = names[bad[0]] if bad and bad[0] < len(names) else None
                continue
            forward = self._forward.pop(update, None)
            if bad and len(self.captured) < CAPTURE:
                self.captured.append({"iteration": update, "params": part[1],
                                      "nonfinite": len(bad),
                                      "first": self._names[bad[0]] if self._names else {},
                                      "then": _modules_after(bad, self._names),
                                      **({"forward": forward} if forward else {})})
                self._say()

    def _say(self, **extra: Any) -> None:
        self.session.update_meta(overflow={"periods": self.periods, "iterations": self.captured,
                                           **extra})


def _listed(flags: Any) -> list[Any]:
    """Flags as the late reader gives them: a list, or a float for a single gradient."""
    return flags if isinstance(flags, list) else [flags]


def _modules_after(bad: list[int], names: list[dict[str, Any]]) -> list[str]:
    """The modules of the non-finite parameters after the first, each once, in backward order
    (at most BAD_NAMED)."""
    first = names[bad[0]].get("module") if names else None
    later = dict.fromkeys(names[i].get("module") or names[i].get("param", "") for i in bad[1:])
    return [m for m in later if m != first][:BAD_NAMED]


def _watched(optimizers: list[Any]) -> tuple[list[Any], int]:
    """The optimizers' parameters that take gradients, each once, at most MAX_PARAMS; and how
    many there are."""
    seen: dict[int, Any] = {}
    for opt in optimizers:
        for group in opt.param_groups:
            for p in group.get("params", ()):
                if getattr(p, "requires_grad", False):
                    seen.setdefault(id(p), p)
    return list(seen.values())[:MAX_PARAMS], len(seen)


def _compiles() -> bool:
    """Whether torch.compile has compiled a graph in this process."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    try:
        return bool(counters is not None and counters["stats"]["unique_graphs"])
    except Exception:  # a Dynamo of another shape: taken as compiling
        return True
