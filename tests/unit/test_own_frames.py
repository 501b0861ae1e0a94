"""doctor's wrapper frames leave the job's tracebacks (doctor.record.own_frames): a frame of
doctor's that an exception passed through is unlinked, the job's stay in order, and one where
the exception was raised in doctor's code stays."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

from doctor.record.own_frames import OWN_DIRS, exception_without_own_frames


def doctors(name: str, body: str) -> Callable[..., Any]:
    """A function whose code says it is in doctor's package (as a probe's wrapper is)."""
    scope: dict[str, Any] = {}
    exec(compile(f"def {name}(f):\n    {body}\n", OWN_DIRS[0] + "fake_probe.py", "exec"), scope)
    return scope[name]  # type: ignore[no-any-return]


wrapper = doctors("wrapper", "return f()")
broken = doctors("broken", "raise RuntimeError('doctor broke')")


def job_inner() -> None:
    raise ValueError("the job's own error")


def job_outer() -> None:
    wrapper(job_inner)


def names(exc: BaseException) -> list[str]:
    return [f.name for f in traceback.extract_tb(exc.__traceback__)]


def test_a_wrappers_frame_goes_and_the_jobs_stay() -> None:
    try:
        job_outer()
    except ValueError as err:
        assert names(err)[-3:] == ["job_outer", "wrapper", "job_inner"]
        exception_without_own_frames(err)
        assert names(err)[-2:] == ["job_outer", "job_inner"] and "wrapper" not in names(err)


def test_chained_exceptions_are_rewritten_and_doctors_own_error_stays_shown() -> None:
    try:
        try:
            job_outer()
        except ValueError as first:
            raise KeyError("during") from first
    except KeyError as err:
        exception_without_own_frames(err)
        assert err.__cause__ is not None and "wrapper" not in names(err.__cause__)
    try:
        broken(None)
    except RuntimeError as err:
        exception_without_own_frames(err)
        assert names(err)[-1] == "broken"  # raised there: an error of doctor's, shown
    exception_without_own_frames(None)
