"""The model's mode as the job sets it: each stretch from ``model.eval()`` to the next
``model.train()`` (on the module it was called on) is written to the ``eval_mode`` ring, so that
an evaluation with no DataLoader (batches already in memory, a generation loop) is still a
phase (doctor.analyse.phases).

``nn.Module.train`` is wrapped (``eval()`` calls it): the outermost call notes whether the
module's mode changed; the calls torch makes for each child pass straight through. A call that
changes nothing (Hugging Face's Trainer calls ``model.train()`` every step) writes nothing.
Runs inside the job; a failure here is never the job's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ..record.patches import Patches
from ..record.session import Session


def watch_modes(session: Session, patches: Patches, torch: Any,
                trained: Callable[[Any], None] | None = None) -> None:
    """``nn.Module.train`` wrapped to write each eval-mode stretch (restored with ``patches``),
    and to tell ``trained`` each module the job puts in training mode (the outermost call)."""
    module = getattr(getattr(torch, "nn", None), "Module", None)
    orig = getattr(module, "train", None)
    if orig is None:
        return
    clock = session.clock
    state = {"depth": 0, "since": 0}

    @functools.wraps(orig)
    def train(self: Any, mode: bool = True) -> Any:
        if state["depth"]:  # a child, from torch's own loop over the modules
            return orig(self, mode)
        was = getattr(self, "training", None)
        state["depth"] = 1
        try:
            return orig(self, mode)
        finally:
            state["depth"] = 0
            try:
                if mode and trained is not None:
                    trained(self)
                if was is True and not mode:
                    state["since"] = clock()
                elif was is False and mode and state["since"]:
                    session.record_interval("eval_mode", state["since"], clock())
                    state["since"] = 0
            except Exception as err:  # evidence, never the job's problem
                session.swallowed("steps", "noting the model's mode", err)

    patches.put(module, "train", train)
