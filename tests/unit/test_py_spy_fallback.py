"""py-spy missing, refused when doctor checks it, refused when it records: each has its own
reason and hint, never a Rust backtrace, and the in-process sampler gives the stacks instead
(doctor.probes.py_spy, doctor.probes.stacks).

The tests here run no job, process nor clock (tests/unit); those that do are in
tests/e2e/test_py_spy_fallback.py.
"""

from __future__ import annotations

from pathlib import Path

from doctor.probes.py_spy import (
    MISSING_HINT,
    RECORD_HINT,
    py_spy_error,
    record_failure,
)
from doctor.probes.stacks import PySpyRecorder
from doctor.store.control import read_control
from tests.support import PY_SPY_SUSPEND_ERROR


def test_py_spy_s_words_are_kept_without_its_backtrace() -> None:
    said = py_spy_error(PY_SPY_SUSPEND_ERROR)
    assert said == "Failed to suspend process; Operation not permitted (os error 1)"
    reason, hint = record_failure(PY_SPY_SUSPEND_ERROR, 1)
    assert reason.startswith("py-spy record was refused") and hint == RECORD_HINT
    reason, hint = record_failure("Error: no python found in process 12\n", 1)
    assert "refused" not in reason and hint != RECORD_HINT


def test_a_missing_py_spy_says_to_install_it(tmp_path: Path) -> None:
    recorder = PySpyRecorder(tmp_path, py_spy="")
    recorder.start()
    status = recorder.check()
    assert status.ok and "py-spy is not installed" in status.reason
    assert status.hint == MISSING_HINT and "pip install py-spy" in status.hint
    assert read_control(tmp_path).stacks_mode == "in-process"
