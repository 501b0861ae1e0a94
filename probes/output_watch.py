"""The forward half of the overflow watch (doctor.probes.overflow_watch): while it is armed, a
forward hook on each module of the model takes the smallest and largest value of the module's
output (``torch.aminmax``: no copy of the output, and no cast under autocast), on its device, in
the order the modules' forwards end (a module's own ops before the module that called it). At a
skipped iteration's update they are stacked into one flag per module output (both ends finite
or not) and read late with the gradients' flags: the first module whose output was inf or NaN is
where the forward pass overflowed.

A hook returns None (the output is the module's own, untouched), reads a detached view, and
appends at most MAX_OUTPUTS values an iteration; outputs that are not a plain, strided floating
tensor (or a tuple or list whose first item is one) are not read. A hook that fails keeps the
error (never raised into the forward) and reads no more; the watch says it at the update and
stops. Never armed where the job compiles (the
overflow watch's rule). The hooks are removed with the gradients' hooks.
"""

from __future__ import annotations

from typing import Any

from ..record.late_reads import capturing
from .param_names import unwrapped

MAX_MODULES = 4096  # modules hooked
MAX_OUTPUTS = 1 << 14  # outputs read per iteration


class OutputWatch:
    """Hooks on a model's modules while armed; ``flags()`` per skipped iteration."""

    def __init__(self, torch: Any) -> None:
        self._torch = torch
        self.handles: list[Any] = []
        self.names: list[dict[str, str]] = []  # each hooked module's path and class
        self._seen: list[tuple[int, Any]] = []  # (module index, its output's (min, max))
        self.failed: list[BaseException] = []  # what a hook caught (the watch says it, stops)

    def arm(self, model: Any) -> None:
        """A forward hook on each of ``model``'s modules (up to MAX_MODULES)."""
        tensor = self._torch.Tensor
        aminmax = self._torch.aminmax
        seen = self._seen
        self.names = []

        failed = self.failed

        def hooked(i: int) -> Any:
            def ended(_module: Any, _args: Any, output: Any) -> None:
                if len(seen) >= MAX_OUTPUTS or failed:
                    return None
                try:
                    t = output[0] if isinstance(output, tuple | list) and output else output
                    if type(t) is tensor and t.is_floating_point() and not t.is_nested \
                            and t.layout == strided and t.numel() \
                            and not (t.is_cuda and capturing(torch)):  # no kernel in its graph
                        seen.append((i, aminmax(t.detach())))
                except Exception as err:  # never into the job's forward: said at the update
                    failed.append(err)
                return None
            return ended

        strided = self._torch.strided
        torch = self._torch
        for path, module in model.named_modules():
            if len(self.handles) >= MAX_MODULES:
                break
            try:
                handle = module.register_forward_hook(hooked(len(self.names)))
            except Exception:  # a module that takes no hook (a scripted one): not read
                continue
            self.handles.append(handle)
            self.names.append({"module": unwrapped(path), "class": type(module).__name__})

    def flags(self) -> list[tuple[list[tuple[int, int]], Any]]:
        """The outputs read since the last call, per device: ((position in the order the
        forwards ended, module index) each, one finite-or-not flag each, on the device)."""
        if self.failed:
            raise self.failed[0]
        seen = list(self._seen)
        self._seen.clear()
        torch = self._torch
        by_device: dict[Any, tuple[list[tuple[int, int]], list[Any]]] = {}
        for position, (i, (low, high)) in enumerate(seen):
            pairs, ends = by_device.setdefault(low.device, ([], []))
            pairs.append((position, i))
            ends += [low, high]  # stacked in the widest of their types
        return [(pairs, torch.isfinite(torch.stack(ends)).view(-1, 2).all(dim=1))
                for pairs, ends in by_device.values()]

    def clear(self) -> None:
        """The outputs read since the last call dropped (an iteration that stepped)."""
        if self.failed:
            raise self.failed[0]
        self._seen.clear()

    def disarm(self) -> None:
        handles, self.handles = self.handles, []
        self._seen.clear()
        for h in handles:
            h.remove()
