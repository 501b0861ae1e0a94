"""Compile probe: every torch.compile compilation, timed, from TorchDynamo's own callbacks.

A compiled model pays its compile at the first steps and again at each recompilation (a new
input shape, a changed guard): seconds to minutes that belong to no steady step, and that an
analysis of step times alone reads as slow steps or misses. TorchDynamo runs registered
callbacks as each compilation starts and ends (``torch._dynamo.callback``, torch 2.1+); the
probe writes each compilation to the ``compile`` ring: its start and end on the Session's clock,
and its key (doctor.store.records.compile_key): for a compilation of a frame, the frame and
which compilation of it this is (0 the first, 1 and up a recompilation); for one Dynamo defers
(a lazily compiled backward, a CUDA graph recorded at run time), minus the trigger's number.

Why each recompilation happened and where the graph broke are read at each compilation's end
(probes/compile_causes.py) into the process's meta.

``torch._dynamo`` is never imported here (it costs a second): the callbacks are registered when
the job imports it, which ``torch.compile`` does. Runs inside the job; a callback never raises
into the compilation that called it.
"""

from __future__ import annotations

import re
from typing import Any

from ..record.after_import import AfterImport, when_imported
from ..record.session import Session
from ..store.records import DYNAMO, compile_key
from ..verdict import ProbeStatus
from .compile_causes import CompileCauses

_COMPILE_ID = re.compile(r"(\d+)/(\d+)")


def key_of(args: Any) -> int:
    """The ring key of a compilation's callback ``args`` (CallbackArgs; older torch: none)."""
    trigger = getattr(getattr(args, "callback_trigger", None), "value", DYNAMO)
    if trigger != DYNAMO:
        return -int(trigger)
    found = _COMPILE_ID.search(str(getattr(args, "compile_id", "")))
    return compile_key(int(found.group(1)), int(found.group(2))) if found else 0


class CompileProbe:
    name = "compile"

    def __init__(self, session: Session) -> None:
        self.session = session
        self._clock = session.clock
        self._t0 = 0
        self._handler: Any = None
        self._finder: AfterImport | None = None
        self._causes: CompileCauses | None = None

    def check(self) -> ProbeStatus:
        return ProbeStatus(True)  # it waits for torch.compile, whichever torch

    def start(self) -> None:
        self._finder = when_imported("torch._dynamo", self._register)

    def _register(self) -> None:
        causes = CompileCauses(self.session)
        try:
            causes.start()
            self._causes = causes
        except Exception as err:  # no reasons, the compilations are still timed
            self.session.swallowed("compile", "reading Dynamo's recompile reasons", err)
        try:
            from torch._dynamo.callback import callback_handler

            callback_handler.register_start_callback(self._started)
            callback_handler.register_end_callback(self._ended)
        except (ImportError, AttributeError):  # a torch without these callbacks: none timed
            return
        self._handler = callback_handler

    def _started(self, *args: Any) -> None:
        self._t0 = self._clock()

    def _ended(self, *args: Any) -> None:
        try:
            key = key_of(args[0] if args else None)
            self.session.record_interval("compile", self._t0, self._clock(), key)
            if self._causes is not None:
                self._causes.compiled(key)
        except Exception:  # never into the compilation that called it
            pass

    def sample(self) -> None:
        pass  # the callbacks record as the job compiles

    def stop(self) -> None:
        if self._finder is not None:
            self._finder.remove()
        causes, self._causes = self._causes, None
        if causes is not None:
            causes.stop()
        handler, self._handler = self._handler, None
        if handler is not None:
            for remove, callback in ((handler.remove_start_callback, self._started),
                                     (handler.remove_end_callback, self._ended)):
                try:
                    remove(callback)
                except (ValueError, AttributeError):
                    pass
