"""The sweeps: each test under tests/sweeps is marked ``sweep`` here (``pytest -m "not sweep"``
leaves them out, as ``pytest tests/unit`` does). Like the unit tests they start no job and
time nothing, but each reads every recorded trace or cuts one at every place."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.sweep)
