"""Iterations a GradScaler skipped (doctor.analyse.iterations): the forward and backward of each
ran for nothing. A few at the start are the scaler calibrating and a rare one each time the scale
grows are its design; a steady share past that means gradients overflow fp16 (or are inf/NaN
whatever the scale), and the fix depends on what the device runs fast.
"""

from __future__ import annotations

from doctor.analyse.evidence import Evidence
from doctor.analyse.precision import BF16
from doctor.rules.base import rule
from doctor.verdict import Finding, Fix

MIN_SKIPPED = 3  # skipped iterations past the calibration before a word is said
MIN_SHARE = 0.02  # ... and their share of the iterations (the scaler's own growth costs ~1/2000)
WARN_SHARE = 0.10

FIND_OVERFLOW = Fix(
    title="Find what overflows",
    why="a scaler skips an iteration when a gradient is inf or NaN: where that happens every "
        "few iterations, whatever the scale, a value overflows the 16-bit range or is not "
        "finite at all (a log of 0, a division by a norm of 0); anomaly detection names the op "
        "(slow: for a few iterations only)",
    code="with torch.autograd.detect_anomaly():\n    scaler.scale(loss).backward()\n"
         "# or: print the parameters whose .grad is not finite after unscale_\n"
         "scaler.unscale_(optimizer)\n"
         "bad = [n for n, p in model.named_parameters()\n"
         "       if p.grad is not None and not torch.isfinite(p.grad).all()]")
GROW_SLOWER = Fix(
    title="Let the scale grow less often",
    why="each time the scale doubles (every growth_interval clean iterations) and overflows "
        "again, an iteration is skipped: a lower starting scale and a longer interval skip "
        "fewer",
    code="scaler = torch.amp.GradScaler(init_scale=2.0**10, growth_interval=4000)")


@rule("steps.skipped", needs=("iterations",))
def skipped(ev: Evidence) -> list[Finding]:
    its = ev.iterations
    assert its is not None  # guaranteed by needs
    worst = max(its.values(), key=lambda i: i.skipped_later)
    later = worst.skipped_later
    if later < MIN_SKIPPED or later < MIN_SHARE * worst.count:
        return []
    share = worst.wasted_share
    speedup = 1.0 / max(1e-9, 1.0 - share) if share > 0 else None
    fixes = [FIND_OVERFLOW, GROW_SLOWER]
    precision = ev.job.precision
    if precision.dtype == BF16:
        fixes.insert(0, Fix(
            title="Train in bfloat16, without the scaler",
            why=f"bf16 has fp32's range: no overflow, no scaler, no skipped iteration "
                f"({precision.why})",
            code=f"with torch.autocast(\"{precision.device}\", dtype=torch.bfloat16):\n"
                 "    loss = loss_fn(model(x), y)\nloss.backward()\noptimizer.step()",
            estimated_speedup=speedup))
    micro = worst.micro_batches
    return [Finding(
        id="steps.skipped", category="compute",
        severity="warning" if later >= WARN_SHARE * worst.count else "info",
        title=f"The GradScaler skipped {worst.skipped} of {worst.count} iterations"
              f"{f' ({worst.calibrating} calibrating at the start)' if worst.calibrating else ''}"
              f": {later} later ones wasted their forward and backward, {share:.0%} of the run",
        evidence={"rank": worst.rank, "iterations": worst.count, "skipped": worst.skipped,
                  "calibrating": worst.calibrating, "skipped_later": later,
                  "wasted_s": worst.wasted_s, "wasted_share": share,
                  **({"micro_batches": micro} if micro == micro else {})},
        fixes=tuple(fixes), estimated_speedup=speedup)]
