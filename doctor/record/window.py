"""The deep window: the steps the job's recorder profiles with torch.profiler, as ``START,STEPS``
(``--window``, doctor.watch's ``window``, ``DOCTOR_WINDOW`` from the parent to the job), or off.
"""

from __future__ import annotations

ENV_WINDOW = "DOCTOR_WINDOW"  # "START,STEPS", or "off"


def parse_window(text: str) -> tuple[int, int]:
    """"START,STEPS" -> (START, STEPS); "off" -> (0, 0); anything else -> the defaults."""
    if text.strip().lower() == "off":
        return 0, 0
    try:
        start, steps = (int(x) for x in text.split(","))
        return max(1, start), max(1, steps)
    except ValueError:
        return 8, 5


def valid_window(text: str) -> bool:
    parts = text.split(",")
    return len(parts) == 2 and all(p.strip().isdigit() and int(p) > 0 for p in parts)
