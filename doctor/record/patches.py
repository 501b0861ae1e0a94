"""Attributes of torch replaced inside the job (a function, a class's method) by a probe's
wrapper, each put back as the probe stops."""

from __future__ import annotations

from typing import Any


class Patches:
    """What a probe replaced, to put back by ``restore``."""

    def __init__(self) -> None:
        self._done: list[tuple[Any, str, Any]] = []

    def put(self, owner: Any, name: str, new: Any) -> bool:
        """``owner.name = new``, remembering what was there; False where the owner refuses (a
        class or module that cannot be changed): then nothing changed."""
        try:
            orig = getattr(owner, name)
            setattr(owner, name, new)
        except (AttributeError, TypeError):
            return False
        self._done.append((owner, name, orig))
        return True

    def restore(self) -> None:
        """Every replaced attribute back, the last replaced first."""
        for owner, name, orig in reversed(self._done):
            setattr(owner, name, orig)
        self._done = []
