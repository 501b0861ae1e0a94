"""matplotlib gets a writable folder where HOME's is not (hostile review: a read-only HOME made
matplotlib print two lines of its own to doctor run's stderr)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from doctor import reports


def test_an_unwritable_home_gets_a_temporary_matplotlib_folder(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")  # a HOME under a file: nothing can be made there
    for name in ("MPLCONFIGDIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(blocked / "home"))
    reports._matplotlib_folder()
    folder = Path(os.environ["MPLCONFIGDIR"])
    assert folder.is_dir() and folder.name.startswith("doctor-matplotlib-")


def test_a_writable_home_is_left_to_matplotlib(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MPLCONFIGDIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    reports._matplotlib_folder()
    assert "MPLCONFIGDIR" not in os.environ
