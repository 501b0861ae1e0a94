"""The phases beside the training steps, one line each (the terminal summary and the report's
step-time section): evaluation passes, checkpoints, epoch starts and logging calls, with their
count, time each, share of the run and what they were (doctor.analyse.analysis.Sections'
``phases``; the figures are worked out there, formatted here)."""

from __future__ import annotations

from doctor.analyse.analysis import Sections
from doctor.analyse.phase_steps import PhaseSummary
from doctor.analyse.phases import CHECKPOINT, EVALUATION, LOGGING
from doctor.units import human_bytes

NOUNS = {EVALUATION: ("pass", "passes"), CHECKPOINT: ("save", "saves"),
         LOGGING: ("call", "calls")}


def phase_line(p: PhaseSummary) -> str:
    """"evaluation: 8 passes of 20 batches, 3.10 s each, 19.0 % of the run (rank 0)"."""
    one, many = NOUNS.get(p.kind, ("start", "starts"))
    what = ""
    if p.kind == EVALUATION and p.batches:
        what = f" of {p.batches:.0f} batches"
    elif p.kind == CHECKPOINT and p.bytes and p.bytes_s:
        what = f" of {human_bytes(p.bytes / p.count)} at {human_bytes(p.bytes_s)}/s"
    elif p.kind == LOGGING and p.libraries:
        what = f" ({p.libraries})"
    elif p.num_workers is not None:
        what = f" ({p.num_workers} workers, persistent_workers={p.persistent_workers})"
    listed = ", ".join(str(s) for s in p.steps[:5]) + (", ..." if len(p.steps) > 5 else "")
    steps = f"; steps {listed} left out of the training shares" if p.steps else ""
    return (f"{p.label}, rank {p.rank}: {p.count} {one if p.count == 1 else many}{what}, "
            f"{p.per_s:.2f} s each, {p.seconds:.2f} s in all, {p.share:.1%} of the run{steps}")


def phase_lines(sections: Sections) -> list[str]:
    """One line per phase of the lowest rank that had any (the others' are in verdict.json)."""
    if not sections.phases:
        return []
    rank = min(p.rank for p in sections.phases)
    return [phase_line(p) for p in sections.phases if p.rank == rank]
