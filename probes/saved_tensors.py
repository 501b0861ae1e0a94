"""Activation bytes: what autograd saves for backward, per step, during the profiler window.

While the window is open, a default pair of saved-tensor hooks (the mechanism behind
``torch.autograd.graph.saved_tensors_hooks``) sees every tensor autograd keeps for the backward
pass; the pack hook adds its storage's bytes (each storage once per step, the parameters' own
storages left out: weights saved by a matmul are not activations) and hands the tensor back
unchanged. At each step boundary the step's total is kept; at the window's end the hooks are
removed. Works on CPU as on GPU; costs a Python call per saved tensor, for the window's steps
only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class SavedTensorCounter:
    """Counts saved-for-backward bytes per step between ``start`` and ``stop`` (one thread: the
    training thread, where the hooks are pushed and popped)."""

    def __init__(self, torch_module: Any, parameters: Iterable[Any] = ()) -> None:
        self.torch = torch_module
        self.steps: list[tuple[int, int]] = []  # (bytes, tensors) of each finished step
        self.dtypes: dict[str, int] = {}  # "device:dtype" -> bytes over the finished steps
        self._step_dtypes: dict[Any, int] = {}  # (on a GPU, torch.dtype) -> bytes
        self._skip = {_storage_ptr(p) for p in parameters}
        self._seen: set[int] = set()
        self._bytes = 0
        self._tensors = 0
        self._pushed = False

    def start(self) -> None:
        self.torch._C._autograd._push_saved_tensors_default_hooks(self._pack, self._unpack)
        self._pushed = True

    def step(self) -> None:
        """A step boundary: keep the step's total, start the next."""
        if self._bytes or self._tensors:
            self.steps.append((self._bytes, self._tensors))
            for (cuda, dtype), nbytes in self._step_dtypes.items():
                name = f"{'cuda' if cuda else 'cpu'}:{str(dtype).removeprefix('torch.')}"
                self.dtypes[name] = self.dtypes.get(name, 0) + nbytes
        self._step_dtypes.clear()
        self._seen.clear()
        self._bytes = self._tensors = 0

    def stop(self) -> None:
        if self._pushed:
            self._pushed = False
            self.torch._C._autograd._pop_saved_tensors_default_hooks()

    def _pack(self, tensor: Any) -> Any:
        # hot during the window (a call per saved tensor): one storage object, plain ints
        try:
            storage = tensor.untyped_storage()
            ptr = storage.data_ptr()
            if ptr not in self._skip and ptr not in self._seen:
                self._seen.add(ptr)
                nbytes = storage.nbytes()
                self._bytes += nbytes
                self._tensors += 1
                kind = (tensor.is_cuda, tensor.dtype)
                self._step_dtypes[kind] = self._step_dtypes.get(kind, 0) + nbytes
        except Exception:  # a tensor without storage (a subclass, meta): not counted
            pass
        return tensor

    @staticmethod
    def _unpack(tensor: Any) -> Any:
        return tensor


def _storage_ptr(tensor: Any) -> int:
    """Where a tensor's storage starts: one address space for host and device memory (CUDA's
    unified addressing), so the address alone tells storages apart."""
    return int(tensor.untyped_storage().data_ptr())
