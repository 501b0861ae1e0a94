"""The input-stage sample jobs run, with and without the switch that removes their bottleneck, and
end with the JSON line of ``StepTimer.report``; every sample job's ``--ablate`` flips its switch
in one process and reports both sides. Tiny sizes: this checks that they work, not how fast they
are (bench/accuracy.py does that), except for one exaggerated bottleneck.

The tests here run no job, process nor clock (tests/unit); those that do are in
tests/e2e/test_sample_jobs.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support import SAMPLE_JOBS

sys.path.insert(0, str(SAMPLE_JOBS))
from _timing import AblationTimer, blocks, plan, side_lengths


@pytest.mark.parametrize(("cache", "sees_new_bytes"),
                         [(None, True), ("page", True), ("memory", False)])
def test_io_bound_switch_reads_the_files_unless_it_caches_the_arrays(
        tmp_path: Path, cache: str | None, sees_new_bytes: bool) -> None:
    """io_bound's page-cache switch keeps the job's reads (only the storage wait goes); the
    memory one reads each file once, before training."""
    from io_bound import FileDataset, write_files
    paths = write_files(str(tmp_path), count=1, size_mb=0.25)
    dataset = FileDataset(paths, n=2, cache=cache)
    before, _label = dataset[0]
    Path(paths[0]).write_bytes(bytes([255]) * Path(paths[0]).stat().st_size)
    after, _label = dataset[1]
    assert bool((after != before).any()) == sees_new_bytes


def test_switch_after_plans_one_block_a_side() -> None:
    _timer, sides = plan(16, 0, False, switch_after=10)
    assert sides == [(False, 10), (True, 6)]
    assert side_lengths(sides) == {False: 10, True: 6}
    assert plan(16, 0, True, switch_after=16)[1] == [(True, 16)]  # nothing left to switch
    assert side_lengths(list(blocks(7, 3))) == {False: 3, True: 3}


def test_blocks_alternate_from_the_switch_off() -> None:
    assert list(blocks(7, 3)) == [(False, 3), (True, 3), (False, 1)]
    assert list(blocks(4, 10)) == [(False, 4)]


def test_ablation_timer_leaves_each_blocks_first_steps_out() -> None:
    timer = AblationTimer(block=4, warm=2)
    for switched in (False, True):
        timer.start_block(switched)
        for _ in range(4):
            timer.step()
    assert [len(timer.times[s]) for s in (False, True)] == [2, 2]


def test_ablation_timer_times_the_training_part_of_counted_steps_only() -> None:
    timer = AblationTimer(block=4, warm=2)
    for switched, train in ((False, 0.5), (True, 0.25)):
        timer.start_block(switched)
        for _ in range(4):
            timer.train(train)
            timer.step()
    assert timer.trains == {False: [0.5, 0.5], True: [0.25, 0.25]}
