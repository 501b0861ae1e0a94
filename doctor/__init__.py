"""doctor: where does my training step time go, and what do I change to get it back?

Public API for the job's own code: ``doctor.watch`` (decorator or context manager) and
``doctor.step()`` (marks a step boundary in loops that doctor cannot see by itself).
"""

from __future__ import annotations

from doctor.record.markers import step
from doctor.version import __version__
from doctor.watch import watch

__all__ = ["__version__", "step", "watch"]
