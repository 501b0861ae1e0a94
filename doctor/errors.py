"""One error hierarchy; the CLI catches it at the top and prints one line (exit status 2).

Every error a user can cause (a command line, a run directory, a trace, a rules file) is a
DoctorError whose message is one line saying what is wrong and what to do. Errors inside the job
never reach the user this way: the bootstrap and the probes swallow them and report the probe as
unavailable instead.
"""

from __future__ import annotations


class DoctorError(Exception):
    """An error the user can fix; its message is one line that says what to do."""

    exit_code = 2


class UsageError(DoctorError):
    """The command line names something that cannot be run or written."""


class RunDirError(DoctorError):
    """A run directory that is missing, unreadable or not doctor's."""


class RunFormatError(RunDirError):
    """A run directory written in a format this doctor does not read (an older version's)."""


class RingFormatError(RunDirError, ValueError):
    """A ring file that is not one of ours, or is truncated."""


class RingVersionError(RingFormatError):
    """A ring written by another version of doctor (its records are laid out differently)."""

    def __init__(self, message: str, version: int) -> None:
        super().__init__(message)
        self.version = version


class TraceError(DoctorError, ValueError):
    """A trace file that cannot be read: missing, truncated, or not Chrome-trace JSON."""


class VerdictSchemaError(DoctorError, ValueError):
    """A verdict.json that does not follow doctor.verdict/1."""


class RecordSchemaError(DoctorError, ValueError):
    """A record doctor wrote (a process's meta.json, a try's try.json, a comparison) that does
    not have the shape its reader needs."""


class WindowUnavailable(DoctorError):
    """The profiler window's trace could not be read or has no usable step (it costs the split
    of the step's time, not the verdict)."""


class FrameRulesError(DoctorError):
    """A frame rules file (DOCTOR_FRAME_RULES, or the built-in table) that cannot be used."""


class Interrupted(DoctorError):
    """The user stopped a command that runs their job (Ctrl-C during doctor try)."""

    exit_code = 130
