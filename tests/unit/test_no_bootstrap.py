"""A job that doctor could not record says why: Python's -I, -E or -S kept the bootstrap out,
or the job ran too few steps to time one; never a false "torch was never imported".

The tests here run no job, process nor clock (tests/unit); those that do are in
tests/e2e/test_no_bootstrap.py.
"""

from __future__ import annotations

import pytest

from doctor.command import bootstrap_blockers


@pytest.mark.parametrize(("argv", "said"), [
    (["python", "-I", "train.py"], ["-I"]),
    (["/venv/bin/python3.11", "-uS", "train.py", "-E"], ["-S"]),  # -E is the script's
    (["python", "-W", "ignore", "-E", "-m", "pkg"], ["-E"]),
    (["python", "-Wignore::E", "train.py"], []),  # a warning filter, not -E
    (["python", "-Im", "pkg"], ["-I"]),
    (["python", "-c", "import x", "-S"], []),
    (["torchrun", "-I", "train.py"], []),
])
def test_the_options_that_keep_the_bootstrap_out(argv: list[str], said: list[str]) -> None:
    assert [s.split()[0] for s in bootstrap_blockers(argv)] == said
