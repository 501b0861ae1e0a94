"""The one bytes formatter: a title's style (the rules) and a report's (every unit to one
decimal), pinned as they were written before they were one function."""

from __future__ import annotations

import pytest

from doctor.reports.text import format_value
from doctor.units import human_bytes


@pytest.mark.parametrize(("value", "title", "report"), [
    (1023, "1023 B", "1023.0 B"),
    (1024, "1 KiB", "1.0 KiB"),
    (640 * 2**20, "640 MiB", "640.0 MiB"),
    (1.5 * 2**30, "1.5 GiB", "1.5 GiB"),
    (150 * 2**30, "150 GiB", "150.0 GiB"),
    (3 * 2**40, "3.0 TiB", "3.0 TiB"),
    (5 * 2**50, "5120.0 TiB", "5120.0 TiB"),
    (-2 * 2**30, "-2.0 GiB", "-2.0 GiB"),
])
def test_bytes_read_as_a_person_reads_them(value: float, title: str, report: str) -> None:
    assert human_bytes(value) == title
    assert human_bytes(value, decimals=1) == report


def test_a_reports_figure_in_bytes_is_one_decimal_from_a_kib() -> None:
    assert format_value("peak_bytes", 1.5 * 2**30) == "1.5 GiB"
    assert format_value("peak_bytes", 1000) == "1000"
