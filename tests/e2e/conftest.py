"""The end-to-end tests: each is marked ``e2e`` here (``pytest -m "not e2e"`` leaves them out,
as ``pytest tests/unit`` does), and the fixture for the tests that need two cores."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support import parallel_cores

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture
def two_cores() -> None:
    """For tests whose job must run two processes at once (a DataLoader's workers beside the
    training loop) to show what they assert: skipped, with the reason, when the machine runs
    two busy processes at well under twice the speed of one."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: two processes cannot run at once")
    got = parallel_cores()
    if got < 1.6:
        pytest.skip(f"the machine runs two busy processes at {got:.1f}x one's speed now, not 2x "
                    "(a shared VM's second core taken): workers cannot show a speedup")
