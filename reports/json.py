"""The JSON report: the verdict exactly as ``verdict.json`` holds it (schema doctor.verdict/1)."""

from __future__ import annotations

import json

from doctor.verdict import Analysis


def render_json(analysis: Analysis) -> str:
    """``analysis.verdict.to_dict()`` as indented JSON, as ``verdict.json`` holds it."""
    return json.dumps(analysis.verdict.to_dict(), indent=2) + "\n"
