"""Fixtures for every test: a fake clock, a file for planted links to point at, and a guard
against samplers left running by a test. The helpers the tests share are in tests/support.py;
tests/e2e/conftest.py marks the end-to-end tests."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import VICTIM_TEXT, FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_000_000_000)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file of the user's outside the run directory, for links planted to point at."""
    path = tmp_path / "elsewhere" / "precious.txt"
    path.parent.mkdir()
    path.write_text(VICTIM_TEXT)
    return path


@pytest.fixture(autouse=True)
def no_sampler_left_running() -> Iterator[None]:
    before = {t.ident for t in threading.enumerate()}
    yield
    left = [t for t in threading.enumerate()
            if t.ident not in before and t.name.startswith("doctor") and t.is_alive()]
    assert not left, f"test left doctor threads running: {[t.name for t in left]}"
