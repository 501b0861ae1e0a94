"""The JSON report: the verdict exactly as ``verdict.json`` holds it (schema doctor.verdict/1)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from doctor.analyse.analysis import Analysis
from doctor.store.redact import redact_argv
from doctor.verdict import Verdict


def render_json(analysis: Analysis) -> str:
    """``analysis.verdict`` as indented JSON, as ``verdict.json`` holds it (verdict_data)."""
    return json.dumps(verdict_data(analysis.verdict), indent=2) + "\n"


def verdict_data(verdict: Verdict) -> dict[str, Any]:
    """``verdict.to_dict()`` with the job's argv's secrets hidden (doctor.store.redact),
    whatever recorded it: what verdict.json and the report's embedded verdict hold."""
    data = verdict.to_dict()
    job = data.get("job")
    if isinstance(job, dict):
        argv = job.get("argv")
        if isinstance(argv, Sequence) and not isinstance(argv, str):
            data["job"] = {**job, "argv": redact_argv(argv)}
    return data
