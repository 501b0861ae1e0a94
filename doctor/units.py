"""Figures as a person reads them: the one bytes formatter, for the rules' titles and the
reports alike (shared below both, like doctor.verdict)."""

from __future__ import annotations


def human_bytes(value: float, decimals: int | None = None) -> str:
    """``1.5 GiB``, ``640 MiB``: bytes in the largest binary unit under 1024 of it (TiB at most).
    ``decimals``: that many in every unit (a report's figure: ``640.0 MiB``); None (a title):
    whole numbers up to MiB, one decimal under 100 GiB and in TiB."""
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    step = 0
    while not abs(value) < 1024 and step < len(units) - 1:  # NaN: in TiB, as it always was
        value /= 1024
        step += 1
    unit = units[step]
    if decimals is None:
        decimals = 1 if unit == "TiB" or (unit == "GiB" and abs(value) < 100) else 0
    return f"{value:.{decimals}f} {unit}"
