"""A one-shot import hook: run a callback right after a module is imported, without importing
it first (the bootstrap starts the probes after ``import torch``; the checkpoints probe wraps
safetensors and torch.distributed.checkpoint after the job imports them). Runs inside the job;
a callback that raises is noted in the process's meta, never raised into the job's import."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING

from . import session as session_mod
from .patches import Patches

if TYPE_CHECKING:
    import importlib.machinery


class AfterImport:
    """A one-shot meta path finder that runs ``callback`` after module ``name`` is imported."""

    def __init__(self, name: str, callback: Callable[[], None]) -> None:
        self.name = name
        self.callback = callback
        self._busy = False

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name or self._busy:
            return None
        import importlib.util  # here, not at start-up: the job's own import of torch

        self._busy = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy = False
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        exec_module = loader.exec_module
        finder = self

        def exec_then_hook(module: ModuleType) -> None:
            exec_module(module)
            finder.remove()
            try:
                finder.callback()
            except Exception as err:  # the job goes on; the run directory says what failed
                _note_failure(err)

        loader.exec_module = exec_then_hook  # type: ignore[method-assign]
        return spec

    def remove(self) -> None:
        """Out of the import system (imported already, or no longer wanted)."""
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def when_imported(name: str, callback: Callable[[], None]) -> AfterImport | None:
    """Run ``callback`` now if the job imported module ``name`` already, else right after it
    does: the hook waiting for it (to ``remove`` at stop), or None where it ran now."""
    if name in sys.modules:
        callback()
        return None
    finder = AfterImport(name, callback)
    sys.meta_path.insert(0, finder)
    return finder


class ImportWraps:
    """What a probe wraps in libraries the job imports: each module's wrapping runs now where
    the job imported it already, else right after it does; ``undo`` removes the hooks still
    waiting and puts every original back (``patches``: where the wrappers are put)."""

    def __init__(self) -> None:
        self.patches = Patches()
        self._finders: list[AfterImport] = []

    def on_import(self, modules: Iterable[str], wrap: Callable[[str], None]) -> None:
        """``wrap(module)`` for each of ``modules`` once the job has imported it."""
        for module in modules:
            finder = when_imported(module, functools.partial(wrap, module))
            if finder is not None:
                self._finders.append(finder)

    def undo(self) -> None:
        for finder in self._finders:
            finder.remove()
        self._finders = []
        self.patches.restore()


def _note_failure(err: BaseException) -> None:
    current = session_mod.current()
    if current is not None:
        try:
            current.update_meta(probe_error=f"{type(err).__name__}: {err}")
        except OSError:
            pass
