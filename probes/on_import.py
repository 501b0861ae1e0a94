"""What the probes that read the job's objects as it builds them share: once the job imports a
module (never before: doctor.record.after_import), they wrap constructors in it; nothing runs
per step; what they noted goes to meta.json when the profiler window ends and at exit. The
wrapped attributes are put back as the probe stops."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from ..record.after_import import ImportWraps
from ..record.session import CLOSE, WINDOW_END, Session
from ..verdict import ProbeStatus


class OnImportProbe:
    """A probe that wraps what ``module`` defines once the job imports it (``wrap``) and
    writes what it noted (``record``)."""

    name = ""
    module = ""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._wraps = ImportWraps()

    def check(self) -> ProbeStatus:
        return ProbeStatus(True)

    def imports(self) -> dict[str, Callable[[], None]]:
        """Each module waited for, with what runs once the job imports it."""
        return {self.module: self.wrap}

    def start(self) -> None:
        for module, callback in self.imports().items():
            self._wraps.on_import((module,), lambda _module, run=callback: run())
        self.session.on(WINDOW_END, self.record)
        self.session.on(CLOSE, self.record)

    def sample(self) -> None:
        pass  # construction-time only

    def stop(self) -> None:
        self._wraps.undo()

    def wrap_init(self, module: str, name: str, wrapper: Callable[[Any], Any]) -> None:
        """Class ``name`` of the imported ``module``: its own ``__init__`` replaced by
        ``wrapper(__init__)``; a failure is the probe's reason, never the job's."""
        try:
            cls = getattr(sys.modules.get(module), name, None)
            init = vars(cls).get("__init__") if isinstance(cls, type) else None
            if init is not None:
                self._wraps.patches.put(cls, "__init__", wrapper(init))
        except Exception as err:  # evidence, never a reason to fail the job
            self.session.swallowed(self.name, f"wrapping {name}", err)

    def wrap(self) -> None:
        raise NotImplementedError

    def record(self) -> None:
        raise NotImplementedError
