"""What ``doctor report`` refuses in one line (doctor.sources, doctor.outputs): two runs given
as if they were the nodes of one job (both hold rank 0), and doctor's own timeline given as a
torch.profiler trace; the node folders of one job are still one report."""

from __future__ import annotations

from pathlib import Path

import pytest

from doctor.errors import UsageError
from doctor.outputs import analyse_runs
from doctor.sources import report_sources
from doctor.store import layout
from tests.support import record_loop, write_record


def run(path: Path, rank: int = 0) -> Path:
    record_loop(path, 30, compute_s=0.01, rank=rank)
    write_record(path)
    return path


def test_two_runs_are_not_the_nodes_of_one_job(tmp_path: Path) -> None:
    a, b = run(tmp_path / "a"), run(tmp_path / "b")
    with pytest.raises(UsageError, match=r"both hold rank 0: they are two runs.*doctor compare"):
        analyse_runs([a, b])
    node0, node1 = run(tmp_path / "n0", rank=0), run(tmp_path / "n1", rank=1)
    assert analyse_runs([node0, node1]).verdict.job["ranks"] == 2


def test_doctors_own_timeline_is_not_a_trace(tmp_path: Path) -> None:
    a = run(tmp_path / "a")
    timeline = a / layout.TIMELINE
    timeline.write_bytes(b"")
    with pytest.raises(UsageError, match=r"doctor's own timeline.*doctor report"):
        report_sources([timeline])
    elsewhere = tmp_path / layout.TIMELINE  # a trace that happens to have that name
    elsewhere.write_bytes(b"")
    assert report_sources([elsewhere]).traces == (elsewhere,)
