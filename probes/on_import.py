"""What the probes that read the job's objects as it builds them share: once the job imports a
module (never before: doctor.record.after_import), they wrap constructors in it; nothing runs
per step; what they noted goes to meta.json when the profiler window ends and at exit. The
wrapped attributes are put back as the probe stops."""

from __future__ import annotations

from ..record.after_import import AfterImport, when_imported
from ..record.patches import Patches
from ..record.session import CLOSE, WINDOW_END, Session
from ..verdict import ProbeStatus


class OnImportProbe:
    """A probe that wraps what ``module`` defines once the job imports it (``wrap``) and
    writes what it noted (``record``)."""

    name = ""
    module = ""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._patches = Patches()
        self._finder: AfterImport | None = None

    def check(self) -> ProbeStatus:
        return ProbeStatus(True)

    def start(self) -> None:
        self._finder = when_imported(self.module, self.wrap)
        self.session.on(WINDOW_END, self.record)
        self.session.on(CLOSE, self.record)

    def sample(self) -> None:
        pass  # construction-time only

    def stop(self) -> None:
        if self._finder is not None:
            self._finder.remove()
            self._finder = None
        self._patches.restore()

    def wrap(self) -> None:
        raise NotImplementedError

    def record(self) -> None:
        raise NotImplementedError
