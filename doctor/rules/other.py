"""Time outside the measured parts of a step: logging, checkpoints, evaluation, Python."""

from __future__ import annotations

import numpy as np

from doctor.analyse.evidence import Evidence
from doctor.rules.base import rule
from doctor.verdict import Finding, Fix

OTHER_SHARE = 0.2
SPIKE = 3.0  # a step this many times the median is a spike (checkpoint, evaluation)


@rule("steps.other", needs=("ledger",))
def other_time(ev: Evidence) -> list[Finding]:
    ledger = ev.ledger
    assert ledger is not None
    wall = ledger["wall_s"].to_numpy(dtype=float)
    total = float(wall.sum())
    if total <= 0:
        return []
    share = float(ledger["other"].sum()) / total
    median = float(np.median(wall))
    spikes = wall > SPIKE * median
    spike_share = float((wall[spikes] - median).sum()) / total
    findings = []
    if share - spike_share >= OTHER_SHARE:  # spread over ordinary steps, not the spikes below
        findings.append(Finding(
            id="steps.other", category="other", severity="warning",
            title=f"{share:.0%} of step time is outside forward, backward, optimizer and input",
            evidence={"other_share": share, "median_step_s": median},
            fixes=(Fix(
                title="Look for per-step work that is not training",
                why="Logging that syncs (loss.item() every step), metrics on the host, "
                    "checkpoints and evaluation inside the loop all land here.",
                code="if step % 100 == 0:\n    print(loss.item())  # not every step",
            ),),
            estimated_speedup=1.0 / max(1e-9, 1.0 - share),
        ))
    # the spikes with a known cause are that cause's (doctor.rules.causes); the rest are here
    known = ev.slow_steps.explained() if ev.slow_steps is not None else set()
    caused = _pairs_in(ledger["rank"].to_numpy(np.int64), ledger["step"].to_numpy(np.int64),
                       known)
    unknown = spikes & ~caused
    unknown_share = float((wall[unknown] - median).sum()) / total
    if unknown_share >= 0.1:
        said = "" if not (spikes & caused).any() else " with no known cause"
        extra = {} if not said else {"explained_steps": int((spikes & caused).sum())}
        findings.append(Finding(
            id="steps.spikes", category="other", severity="warning",
            title=f"{int(unknown.sum())} slow steps{said} (over {SPIKE:.0f}x the median) cost "
                  f"{unknown_share:.0%} of the time",
            evidence={"spike_steps": int(unknown.sum()), "spike_share": unknown_share,
                      "median_step_s": median, "slowest_step_s": float(wall[unknown].max()),
                      **extra},
            fixes=(Fix(
                title="Make periodic work rarer or asynchronous",
                why="Checkpoints and evaluation every few steps stall training.",
                code="if step % 1000 == 0:\n    torch.save(model.state_dict(), path)",
            ),),
            estimated_speedup=1.0 / max(1e-9, 1.0 - unknown_share),
        ))
    return findings


def _pairs_in(ranks: np.ndarray, steps: np.ndarray, known: set[tuple[int, int]]) -> np.ndarray:
    """Whether each (rank, step) is one of ``known`` (vectorised: a ledger of millions)."""
    if not known:
        return np.zeros(len(ranks), dtype=bool)
    pairs = np.array(sorted(known), dtype=np.int64)
    out = np.zeros(len(ranks), dtype=bool)
    for rank in np.unique(pairs[:, 0]):
        mine = ranks == rank
        out[mine] = np.isin(steps[mine], pairs[pairs[:, 0] == rank, 1])
    return out
