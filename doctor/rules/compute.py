"""Compute rules: when the step's own work dominates, say where and how to make it cheaper."""

from __future__ import annotations

from doctor.analyse.evidence import Evidence
from doctor.rules.base import rule
from doctor.rules.host import set_threads
from doctor.rules.sound import PLAIN_COMPILE
from doctor.verdict import Finding, Fix

COMPUTE_BOUND = 0.5


@rule("compute.bound", needs=("ledger",))
def compute_bound(ev: Evidence) -> list[Finding]:
    ledger = ev.ledger
    assert ledger is not None
    wall = float(ledger["wall_s"].sum())
    share = float(ledger["compute"].sum()) / wall if wall > 0 else 0.0
    if share < COMPUTE_BOUND:
        return []
    device = ev.job.device
    threads = ev.job.torch_threads
    cores = ev.job.cores
    evidence = {
        "compute_share": share,
        "backward_share": float(ledger["backward_s"].sum()) / wall,
        "optimizer_share": float(ledger["optimizer_s"].sum()) / wall,
        "device": device, "torch_threads": threads, "cores": cores,
    }
    fixes = [Fix(
        title="Compile the model",
        why="torch.compile fuses elementwise ops and cuts Python overhead per op.",
        code=PLAIN_COMPILE,
    )]
    if device == "cpu":
        precision = ev.job.precision
        # measured faster here, and not what the job does already
        if precision.device == "cpu" and precision.dtype is not None \
                and ev.job.autocasts_on("cpu") is None:
            fixes.append(Fix(
                title=f"Run the forward pass in {precision.dtype}",
                why=f"Halves memory traffic; {precision.why}.",
                code=precision.autocast_code(),
            ))
        if threads is not None and cores is not None and threads < cores:
            fixes.append(set_threads(
                f"torch uses {threads} of {cores} cores",
                "Intra-op threads below the core count leave cores idle in compute.", cores))
    title = f"Compute-bound: the model's own work takes {share:.0%} of the step"
    return [Finding("compute.bound", "compute", "info", title, evidence, tuple(fixes))]
