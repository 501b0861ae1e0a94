"""The words beside a fix that ``doctor try`` measured (text and HTML reports alike)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

OUTCOME_WORDS = {
    "faster": "faster", "slower": "slower", "no change": "no measurable change",
    "unchanged": "nothing to change", "not applied": "did not reach the job",
    "failed": "the job failed", "no steps": "no steps measured",
}


#: Outcomes of a try that measured no speedup: their reason is what is said.
UNMEASURED = ("failed", "unchanged", "not applied", "no steps")


def times(value: Any) -> str:
    return f"{float(value):.2f}x" if isinstance(value, int | float) and value else "-"


def millis(value: Any) -> str:
    return f"{float(value) * 1e3:.1f} ms" if isinstance(value, int | float) else "-"


def verified_line(verified: Mapping[str, Any]) -> str:
    """'verified: measured 2.9x (2.7-3.1), estimated 3.2x' (or what the try came to)."""
    outcome = verified.get("outcome")
    if outcome in UNMEASURED:
        return f"tried: {verified.get('why') or OUTCOME_WORDS.get(str(outcome), outcome)}"
    word = "tried" if outcome in ("no change", "slower") else "verified"
    text = f"{word}: measured {times(verified.get('speedup'))}"
    if verified.get("low") and verified.get("high"):
        text += f" ({float(verified['low']):.1f}-{float(verified['high']):.1f})"
    if verified.get("estimated"):
        text += f", estimated {times(verified['estimated'])}"
    if outcome == "no change":
        text += ": no measurable change"
    if verified.get("unsure"):
        text += " (unsure: the machine's speed changed during the try)"
    return text
