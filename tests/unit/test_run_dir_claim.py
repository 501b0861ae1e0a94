"""A run directory is one run (issue 32): an --out holding an earlier run is refused in one line
(exit 2, naming --force), --force replaces it (never merged), two doctor runs into one directory
at once are refused by a lock that a dead run does not leave behind, a node of a multi-node job
claims its own folder only, and doctor.watch(out=...) keeps the same rule without stopping the
job. The jobs are plain Python, but for one small torch job run twice.

The tests here run no job, process nor clock (tests/unit); those that do are in
tests/e2e/test_run_dir_claim.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from doctor.store.claim import release_run_dir
from doctor.store.rundir import new_run_dir


def test_default_directories_are_new_each_time(tmp_path: Path) -> None:
    root = tmp_path / "doctor-runs"
    made = [new_run_dir(None, "job", root) for _ in range(3)]
    for run_dir in made:
        release_run_dir(run_dir)
    assert len(set(made)) == 3 and all(p.parent == root.resolve() for p in made)


def test_tries_started_in_the_same_second_get_a_folder_each(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    from doctor.store import tries

    monkeypatch.setattr(tries.time, "strftime", lambda _fmt: "20261203-120000")
    made = [tries.new_try_dir(tmp_path) for _ in range(3)]
    assert [p.name for p in made] == ["20261203-120000", "20261203-120000-2",
                                      "20261203-120000-3"]
