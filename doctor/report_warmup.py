"""While the job starts, import what its report will need (the analysis, pandas, matplotlib and
its fonts) in a thread of the ``doctor run`` parent, so the verdict and the report follow the
job's end without the second or so those imports take.

It starts just after the job does, while the job itself imports torch (seconds before its first
step), so it takes no core from the job's steps on any machine with two cores or more. It only
imports: nothing is read, written or started, and a module that fails to import here is left to
the report, which imports it again and says what failed. Its CPU is doctor's one-off cost, kept
out of the parent's always-on sampling cost in run.json (``cpu_s``). Its memory: doctor's
process holds about 110 MB while the job runs instead of about 40 (measured: compute_bound.py),
what it held after the job before."""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Sequence

#: What the verdict and the report import after the job (doctor.run_summary's imports and
#: theirs), in the order they are needed.
REPORT_MODULES: tuple[str, ...] = (
    "doctor.outputs",
    "doctor.reports.text",
    "doctor.reports.html",
    "doctor.reports.timeline",
)


class ReportWarmup:
    """One background thread importing ``modules`` in order; ``start()`` once."""

    def __init__(self, modules: Sequence[str] = REPORT_MODULES) -> None:
        self._modules = tuple(modules)
        self._thread = threading.Thread(target=self._run, name="doctor-report-warmup",
                                        daemon=True)
        self._cpu_s = 0.0
        self._done = threading.Event()
        self.failed: str | None = None  # the first module that could not be imported

    def start(self) -> ReportWarmup:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            for name in self._modules:
                try:
                    importlib.import_module(name)
                except BaseException:  # the report imports it again and says what fails
                    self.failed = name
                    return
        finally:
            self._cpu_s = time.thread_time()
            self._done.set()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Whether the imports are over (waiting up to ``timeout_s``)."""
        return self._done.wait(timeout_s)

    def cpu_s(self) -> float:
        """The CPU seconds the thread has used so far (0 before it starts)."""
        if self._done.is_set() or self._thread.ident is None:
            return self._cpu_s
        try:
            return time.clock_gettime(time.pthread_getcpuclockid(self._thread.ident))
        except (OSError, AttributeError):  # it ended meanwhile, or not on this platform
            self._done.wait(0.1)
            return self._cpu_s
