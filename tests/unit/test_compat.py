"""doctor.compat: a torch built for NumPy 1.x beside NumPy 2 is said in one line."""

from __future__ import annotations

from doctor.compat import numpy_mismatch


def test_an_old_torch_beside_numpy_2_is_named_with_the_fix() -> None:
    line = numpy_mismatch(torch=(2, 1), numpy=(2, 4))
    assert line is not None and "torch 2.1" in line and "NumPy 2.4" in line
    assert 'pip install "numpy<2"' in line and "\n" not in line


def test_versions_that_work_together_say_nothing() -> None:
    assert numpy_mismatch(torch=(2, 1), numpy=(1, 26)) is None
    assert numpy_mismatch(torch=(2, 3), numpy=(2, 0)) is None
    assert numpy_mismatch(torch=(2, 13), numpy=(2, 4)) is None


def test_this_environment_is_read_without_error() -> None:
    assert numpy_mismatch() is None  # torch 2.13 here works with either NumPy
