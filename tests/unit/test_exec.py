"""A process that ``os.execv``s another Python under ``doctor run``: the new image keeps its pid,
and before the fix its Session recreated the process folder and truncated the rings of the
steps recorded before the exec.

The tests here run no job, process nor clock (tests/unit); those that do are in
tests/e2e/test_exec.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from doctor.store.process import ProcessWriter, trained
from doctor.store.records import INTERVAL_RECORD, STEPS_RECORD


def folders(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "rank-0").iterdir())


def test_a_new_image_beside_an_earlier_one_that_trained(tmp_path: Path) -> None:
    earlier = ProcessWriter(tmp_path, 0, "main", 42)
    earlier.create()
    earlier.ring("steps", *STEPS_RECORD, 16).write(1, 3, 0)
    later = ProcessWriter(tmp_path, 0, "main", 42)
    assert later.create() == tmp_path / "rank-0" / "main-42.1"
    assert folders(tmp_path) == ["main-42", "main-42.1"]
    assert trained(tmp_path / "rank-0" / "main-42")  # its ring untouched
    third = ProcessWriter(tmp_path, 0, "main", 42)
    assert third.create().name == "main-42.2"


def test_an_earlier_image_that_did_not_train_makes_way(tmp_path: Path) -> None:
    launcher = ProcessWriter(tmp_path, 0, "main", 42)
    launcher.create()
    launcher.write_meta({"argv": ["launch.py"]})
    launcher.ring("loader_wait", *INTERVAL_RECORD, 16).write(1, 2, 0)  # read a batch or two
    job = ProcessWriter(tmp_path, 0, "main", 42)
    assert job.create() == tmp_path / "rank-0" / "main-42"
    assert folders(tmp_path) == ["main-42", "main-42.1"]
    kept = json.loads((tmp_path / "rank-0" / "main-42.1" / "meta.json").read_text())
    assert kept["argv"] == ["launch.py"]
    assert not (tmp_path / "rank-0" / "main-42" / "meta.json").exists()
