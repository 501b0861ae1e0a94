"""Evidence for rule tests, from the few facts each test states."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from doctor.analyse.evidence import Evidence
from doctor.analyse.split import InputSplit
from doctor.analyse.stages import JobFacts

JOB_FIELDS = {f.name for f in fields(JobFacts)}
EVIDENCE_FIELDS = {f.name for f in fields(Evidence)}


def evidence(*, split: dict[str, float] | None = None,
             top: dict[str, tuple[str, ...]] | None = None,
             collate_share: float | None = None, **facts: Any) -> Evidence:
    """Frames and Evidence fields as given; JobFacts fields (cores, device, ...) make the job;
    ``split`` (stage -> share of loading, with ``top`` and ``collate_share``) the InputSplit."""
    job = JobFacts(**{k: v for k, v in facts.items() if k in JOB_FIELDS})
    rest = {k: v for k, v in facts.items() if k not in JOB_FIELDS}
    unknown = set(rest) - EVIDENCE_FIELDS
    assert not unknown, f"not evidence: {unknown}"
    if split is not None:
        rest["input_split"] = InputSplit(stage_shares=split, top=top or {},
                                         collate_share_of_fetch=collate_share)
    return Evidence(job=job, **rest)
