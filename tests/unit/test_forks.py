"""Forked children under ``doctor run``: a child forked before, during or after the profiler
window ends as it would without doctor (its own exit status, the job's output unchanged), and the
job ends. Before the fix, a child forked during or after the window hung in Kineto's static
destructors and its parent waited for it forever.

The tests here run no job, process nor clock (tests/unit); those that do are in
tests/e2e/test_forks.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from doctor.record import kineto


def test_the_thread_is_left_to_the_dynolog_daemon(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kineto.ENV_DAEMON, "1")
    assert kineto.stop_config_thread().startswith("left running: KINETO_USE_DAEMON is set")


def test_the_library_is_found_where_the_process_mapped_it(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r--p 00000000 08:01 1 /opt/env/lib/libc10.so\n"
        "7f01-7f02 r-xp 00001000 08:01 2 /opt/env/lib/python3/torch/lib/libtorch_cpu.so\n"
        "7f02-7f03 rw-p 00000000 00:00 0 [heap]\n")
    assert kineto.loaded_library(kineto.LIBRARY, str(maps)) == \
        "/opt/env/lib/python3/torch/lib/libtorch_cpu.so"
    assert kineto.loaded_library("libnope.so", str(maps)) is None
    assert kineto.loaded_library(kineto.LIBRARY, str(tmp_path / "absent")) is None
