"""``doctor try --set compile=off``: inside the tried job, ``torch.compile`` hands back the
model or function it was given, unchanged, so the job runs eagerly and the try measures whether
compiling is worth it for this job.

Every way a job compiles goes through ``torch.compile``: called on a module or a function,
as a decorator (``@torch.compile``, ``@torch.compile(mode=...)``), or a module's own
``model.compile()``; each becomes a no-op. The overrides (doctor.record.overrides) say it once
(``doctor try: torch.compile -> eager``) and note in the process's meta
(``tried["torch.compile"]``) how many times the job asked to compile, so that a try of a job
that never compiled says the setting was never reached.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


def eager_patches(torch: Any, asked: Callable[[], None]) -> list[tuple[Any, str, Any]]:
    """(owner, name, replacement) for ``torch.compile`` and ``torch.nn.Module.compile``, each
    compiling nothing and calling ``asked`` when the job asks to compile; none for a torch
    without ``compile`` (before 2.0: nothing compiles anyway)."""
    orig = getattr(torch, "compile", None)
    if orig is None:
        return []

    @functools.wraps(orig)
    def compile(model: Any = None, *args: Any, **kwargs: Any) -> Any:
        asked()
        if model is None:  # @torch.compile(mode=...): the decorator it returns
            return lambda fn: fn
        return model

    patches: list[tuple[Any, str, Any]] = [(torch, "compile", compile)]
    module = getattr(getattr(torch, "nn", None), "Module", None)
    if module is not None and hasattr(module, "compile"):
        def module_compile(self: Any, *args: Any, **kwargs: Any) -> None:
            asked()

        patches.append((module, "compile", module_compile))
    return patches
