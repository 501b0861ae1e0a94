"""The deep window: the steps the job's recorder profiles with torch.profiler, ``START,STEPS``
(both counted from 1) or off. One type, one default and one parser for every door: ``--window``
(doctor.cli), doctor.watch's ``window``, and ``DOCTOR_WINDOW``, which ``doctor run`` hands to
the job's bootstrap (doctor.launch, doctor.bootstrap).

The parser refuses anything else with a usage error (one line). The job's bootstrap reads its
window with ``window_in_job``, which never raises: the parent validated the value it handed
down, and a value set by hand must not stop the job, so there a value the parser refuses means
the default.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from ..errors import UsageError

ENV_WINDOW = "DOCTOR_WINDOW"  # "START,STEPS", or "off"

#: Why no window opens beside the job's own profiler (Kineto holds one session per process: a
#: second one empties the job's profile, and one started inside a scheduled profiler's cycle
#: crashed the job in its trace export).
OWN_PROFILER = ("the job runs its own torch.profiler: doctor's window stays closed (a second "
                "profiler would take its events); the shares come without the window's op split")
#: Why no window opens from a thread other than the one that imported torch: Kineto's first
#: start there prints "ERROR: External init callback must run in same thread as registerClient"
#: into the job's stderr (torch registers its Kineto client as it loads).
OTHER_THREAD = ("the job trains in a thread other than the one that imported torch: a first "
                "torch.profiler there prints a Kineto error line into the job's output, so no "
                "window opens; the shares come without the window's op split")
#: The reasons the window stays closed by choice (doctor.probes.torch_ops), not by failure
#: (doctor.analyse.facts says "no torch.profiler window" for them, not "failed").
STEPPED_ASIDE = (OWN_PROFILER, OTHER_THREAD)


class Window(NamedTuple):
    """Profile ``steps`` steps from step ``start``; off when ``steps`` is 0."""

    start: int = 8
    steps: int = 5

    @property
    def off(self) -> bool:
        return self.steps == 0

    def __str__(self) -> str:
        """The text the parser reads back (``DOCTOR_WINDOW``)."""
        return "off" if self.off else f"{self.start},{self.steps}"


DEFAULT_WINDOW = Window()
OFF = Window(0, 0)


def parse_window(text: str, option: str = "--window") -> Window:
    """``START,STEPS`` (whole numbers from 1) or ``off`` (any case) as a Window; anything else
    a UsageError that names ``option``."""
    if text.strip().lower() == "off":
        return OFF
    parts = text.split(",")
    try:
        if len(parts) == 2 and all(p.strip().isdigit() for p in parts):
            window = Window(int(parts[0]), int(parts[1]))
            if window.start > 0 and window.steps > 0:
                return window
    except ValueError:  # a digit int() does not read ("²")
        pass
    raise UsageError(f"{option} takes START,STEPS (e.g. 8,5) or off, not {text!r}")


def window_of(environ: Mapping[str, str]) -> Window:
    """The window ``DOCTOR_WINDOW`` in ``environ`` names (the default when it is unset or
    empty); a UsageError when it names none."""
    text = environ.get(ENV_WINDOW, "")
    return parse_window(text, option=ENV_WINDOW) if text else DEFAULT_WINDOW


def window_in_job(environ: Mapping[str, str]) -> Window:
    """The job's window, in its bootstrap: as ``window_of``, but the default where the value is
    not one the parser takes (see the module docstring: it never stops the job)."""
    try:
        return window_of(environ)
    except UsageError:
        return DEFAULT_WINDOW
