"""A try's record, ``try.json`` (schema TRY_FORMAT): TryRecord and each setting's TryCandidate.

``to_dict`` is the file's shape (doctor.store.tries writes it, the schema first); ``from_dict``
checks the shape before it reads (RecordSchemaError, one line), and gives what an older record
lacks its default. The baseline's and the cost's figures stay as the file holds them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from ..errors import RecordSchemaError

TRY_FORMAT = "doctor.try/1"


@dataclass(frozen=True)
class TryCandidate:
    """One setting tried (doctor.tries.plan.Candidate), and what its attempts measured."""

    id: str
    label: str = ""
    apply: Mapping[str, Any] | None = None  # the settings, as doctor.tuning takes them
    estimate: float | None = None
    fixes: list[str] = field(default_factory=list)
    title: str = ""
    outcome: str | None = None  # faster, no_change, slower, failed, ... (doctor.tries.measure)
    why: str | None = None
    speedup: float | None = None
    low: float | None = None
    high: float | None = None
    per_round: list[Any] = field(default_factory=list)
    pooled: Any = None
    ratio: float | None = None  # measured against the estimate
    median_step_s: float | None = None  # its pace (doctor.tries.measure.pace), by its old name
    steps: int | None = None
    applied: Mapping[str, Any] = field(default_factory=dict)  # what the jobs had of each setting
    errors: list[str] = field(default_factory=list)
    stderr_tail: str = ""
    attempts: list[str] = field(default_factory=list)  # its attempts' folders, in the try's
    steal_share: list[Any] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TryCandidate:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass(frozen=True)
class TryRecord:
    """One ``doctor try`` of a run: how it ran, the baseline, each setting tried, the cost.
    ``dir``: the try's folder (relative to the run, as doctor.store.tries.read_tries gives
    it)."""

    run: str = ""
    dir: str = ""
    command: list[str] = field(default_factory=list)
    cwd: str = ""
    created: str = ""
    env_notes: list[str] = field(default_factory=list)
    steps: int | None = None
    steps_per_attempt: int | None = None
    stop_at_step: int | None = None
    repeat: int | None = None
    sweep: Any = None
    best: str | None = None  # the id of the fastest setting that measured faster
    unsteady: str | None = None  # why the figures may not hold
    baseline: Mapping[str, Any] = field(default_factory=dict)
    candidates: list[TryCandidate] = field(default_factory=list)
    manual: list[Mapping[str, Any]] = field(default_factory=list)  # fixes that need code
    cost: Mapping[str, Any] = field(default_factory=dict)

    def candidate(self, cid: str) -> TryCandidate | None:
        return next((c for c in self.candidates if c.id == cid), None)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["candidates"] = [c.to_dict() for c in self.candidates]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TryRecord:
        """The record in ``data`` (try.json's dict, the schema key optional here)."""
        check_try(data)
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        values["candidates"] = [TryCandidate.from_dict(c) for c in data.get("candidates") or []]
        return cls(**values)


def check_try(data: Mapping[str, Any]) -> None:
    """Raise RecordSchemaError unless ``data`` has what a try record's readers need."""
    if not isinstance(data, Mapping):
        raise RecordSchemaError("a try record is a JSON object")
    if "schema" in data and data["schema"] != TRY_FORMAT:
        raise RecordSchemaError(f"schema is {data['schema']!r}, expected {TRY_FORMAT!r}")
    for key in ("baseline", "cost"):
        if not isinstance(data.get(key, {}), Mapping):
            raise RecordSchemaError(f"the try record's {key!r} is not an object")
    for key in ("candidates", "manual", "command", "env_notes"):
        value = data.get(key, [])
        if not isinstance(value, Sequence) or isinstance(value, str):
            raise RecordSchemaError(f"the try record's {key!r} is not a list")
    for c in data.get("candidates") or []:
        if not isinstance(c, Mapping) or not isinstance(c.get("id"), str):
            raise RecordSchemaError("each candidate of a try record is an object with an id")
