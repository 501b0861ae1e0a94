"""One error hierarchy; the CLI catches it at the top and prints one line (exit status 2)."""

from __future__ import annotations


class DoctorError(Exception):
    """An error the user can fix; its message is one line that says what to do."""

    exit_code = 2


class UsageError(DoctorError):
    """The command line names something that cannot be run or written."""


class RunDirError(DoctorError):
    """A run directory that is missing, unreadable or not doctor's."""
