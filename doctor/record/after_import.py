"""A one-shot import hook: a callback run once a module has been imported (by the job: torch,
which starts the probes; torch._dynamo, which torch.compile imports), after which the hook
steps out of the import system."""

from __future__ import annotations

import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType


class AfterImport:
    """A one-shot meta path finder that runs ``callback`` after module ``name`` is imported."""

    def __init__(self, name: str, callback: Callable[[], None],
                 on_error: Callable[[BaseException], None] = lambda err: None) -> None:
        self.name = name
        self.callback = callback
        self.on_error = on_error
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
            if finder in sys.meta_path:
                sys.meta_path.remove(finder)
            try:
                finder.callback()
            except Exception as err:  # the job goes on; the run directory says what failed
                finder.on_error(err)

        loader.exec_module = exec_then_hook  # type: ignore[method-assign]
        return spec
