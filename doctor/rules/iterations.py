"""Iterations a GradScaler skipped (doctor.analyse.iterations): the forward and backward of each
ran for nothing. A few at the start are the scaler calibrating and a rare one each time the scale
grows are its design; a steady share past that means gradients overflow fp16 (or are inf/NaN
whatever the scale: then the scale collapses below 1), and a long calibration means a starting
scale far too high. The fix depends on which it is and on what the device runs fast: bf16 (no
scaler at all) only where the device runs it fast, a lower ``init_scale`` where the skips are all
at the start, a longer ``growth_interval`` where they recur as the scale grows back.
"""

from __future__ import annotations

import math

from doctor.analyse.evidence import Evidence
from doctor.analyse.iterations import Iterations, scale_words
from doctor.analyse.overflows import NotFound, Overflow
from doctor.analyse.precision import BF16
from doctor.rules.base import rule
from doctor.verdict import Finding, Fix

MIN_SKIPPED = 3  # skipped iterations past the calibration before a word is said
MIN_SHARE = 0.02  # ... and their share of the iterations (the scaler's own growth costs ~1/2000)
WARN_SHARE = 0.10
MIN_CALIBRATING = 8  # a calibration this long (2^16 settling at 2^8) is too high a start
MIN_CALIBRATING_SHARE = 0.05  # ... where it takes this much of the run

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


def _overflow(ev: Evidence, it: Iterations) -> Overflow | NotFound | None:
    return (ev.overflows or {}).get(it.rank)


def _overflow_evidence(found: Overflow | NotFound | None, forward: bool) -> dict[str, object]:
    """What the overflow watch read; the gradients' first layer left out where the losses were
    already inf/NaN (every gradient is then, from the last layer on: that layer is no cause)."""
    if isinstance(found, NotFound):
        return {"overflow_not_found": found.reason}
    if found is None:
        return {}
    read = {"overflow_read": found.read, "overflow_watched": found.watched,
            **({"overflow_forward_layer": found.forward_where,
                "overflow_forward_in": found.forward_in} if found.forward_in else {})}
    if forward:
        return read
    return {**read, "overflow_layer": found.where, "overflow_param": found.param,
            "overflow_shape": found.shape, "overflow_first_in": found.first_in,
            "overflow_nonfinite_grads": found.nonfinite, "overflow_grads_flagged": found.params,
            **({"overflow_then": found.then} if found.then else {})}


def _overflow_words(found: Overflow) -> str:
    return f"the gradients first overflowed in {found.where}, in {found.first_in} of the " \
           f"{found.read} skipped iterations read ({found.watched} watched)"


def _forward_words(found: Overflow) -> str:
    return f"the forward's outputs first turned inf/NaN in {found.forward_where}, in " \
           f"{found.forward_in} of the {found.read} skipped iterations read"


def _output_fix(ev: Evidence, found: Overflow) -> Fix:
    """The module whose output first overflowed in the forward pass."""
    name = found.forward or "the model"
    return Fix(
        title=f"Keep {found.forward_where} in range: its outputs overflow first",
        why=f"in {found.forward_in} of the {found.read} skipped iterations doctor read, "
            f"{name} was the first module whose output held inf or NaN (the modules inside it "
            "were finite): the 16-bit type's range ends at 65504. Run it outside autocast (in "
            "fp32), or scale what enters it down (a normalisation before it, a smaller init)",
        code=_fp32_code(ev, found.rank, name))


def _fp32_code(ev: Evidence, rank: int, name: str) -> str:
    ran = (ev.precision or {}).get(rank)
    device = ran.autocasts[0][0] if ran is not None and ran.autocasts else ev.job.device
    return f"with torch.autocast(\"{device}\", enabled=False):  # {name} in fp32\n" \
           "    out = layer(x.float())"


def _layer_fix(ev: Evidence, found: Overflow) -> Fix:
    """The layer where the gradients first overflowed, and how to keep it in range."""
    then = f"; the layers before it in the forward pass ({found.then}) take inf/NaN from it" \
        if found.then else ""
    name = f"{found.module}.{found.param}" if found.module else found.param
    return Fix(
        title=f"Keep {found.where} in range: its gradients overflow first",
        why=f"in {found.first_in} of the {found.read} skipped iterations doctor read "
            f"({found.watched} watched), the first gradient of the backward pass that was inf or "
            f"NaN was {name} ({found.shape}; {found.nonfinite} of {found.params} gradients were)"
            f"{then}. Run that layer outside autocast (in fp32), or bring its output's gradient "
            "into fp16's range (a normalisation before it, a smaller init, a loss not summed "
            "over a large dimension)",
        code=_fp32_code(ev, found.rank, found.module or name))


def _grow_slower(it: Iterations, interval: float | None) -> Fix:
    longer = int(max(2 * (interval or 2000), 4000))
    start = it.scale_settled if it.scale_settled == it.scale_settled else 2.0**10
    return Fix(
        title="Let the scale grow less often",
        why="each time the scale doubles (every growth_interval clean iterations) and overflows "
            "again, an iteration is skipped: starting where it settled "
            f"({scale_words(start)}) and growing half as often skips fewer",
        code=f"scaler = torch.amp.GradScaler(init_scale={_power(start)}, "
             f"growth_interval={longer})")


def _power(scale: float) -> str:
    exponent = math.log2(scale) if scale > 0 and math.isfinite(scale) else 10.0
    return f"2.0**{round(exponent)}"


@rule("steps.skipped", needs=("iterations",))
def skipped(ev: Evidence) -> list[Finding]:
    its = ev.iterations
    assert its is not None  # guaranteed by needs
    worst = max(its.values(), key=lambda i: (i.skipped_later, i.calibrating))
    later = worst.skipped_later
    if later >= MIN_SKIPPED and later >= MIN_SHARE * worst.count:
        return [_recurring(ev, worst)]
    if worst.calibrating >= MIN_CALIBRATING \
            and worst.calibrating_share >= MIN_CALIBRATING_SHARE:
        return [_calibration(ev, worst)]
    return []


def _scaler_setting(ev: Evidence, rank: int, name: str) -> float | None:
    found = (ev.precision or {}).get(rank)
    return (found.scaler or {}).get(name) if found is not None else None


def _evidence(ev: Evidence, it: Iterations) -> dict[str, object]:
    found = (ev.precision or {}).get(it.rank)
    micro = it.micro_batches
    # as powers of two: a collapsed scale (2^-22) is no number a verdict's 6 decimals keep
    scales = {f"{k}_log2": round(math.log2(v), 2) if v > 0 else float("-inf")
              for k, v in (("scale_first", it.scale_first), ("scale_settled", it.scale_settled),
                           ("scale_last", it.scale_last), ("scale_lowest", it.scale_lowest))
              if v == v and not math.isinf(v)}
    return {"rank": it.rank, "iterations": it.count, "skipped": it.skipped,
            "calibrating": it.calibrating, "skipped_later": it.skipped_later,
            "wasted_s": it.wasted_s, "wasted_share": it.wasted_share,
            "calibrating_share": it.calibrating_share, **scales,
            **({"collapsed_at": it.collapsed_at} if it.collapsed_at else {}),
            **({"micro_batches": micro} if micro == micro else {}),
            **({"nonfinite_losses": found.nonfinite} if found is not None else {}),
            **({f"scaler_{k}": v for k, v in (found.scaler or {}).items()}
               if found is not None else {}),
            **_overflow_evidence(_overflow(ev, it), found is not None and found.nonfinite > 0)}


def _bf16(ev: Evidence, speedup: float | None) -> list[Fix]:
    """bf16 without the scaler, where the device runs bf16 fast and the job is not in it."""
    precision = ev.job.precision
    if precision.dtype != BF16 or ev.job.autocasts_on(precision.device) == BF16:
        return []
    return [Fix(
        title="Train in bfloat16, without the scaler",
        why=f"bf16 has fp32's range: no overflow, no scaler, no skipped iteration "
            f"({precision.why})",
        code=precision.autocast_code(), estimated_speedup=speedup)]


def _recurring(ev: Evidence, it: Iterations) -> Finding:
    later, share = it.skipped_later, it.wasted_share
    speedup = 1.0 / max(1e-9, 1.0 - share) if share > 0 else None
    found = (ev.precision or {}).get(it.rank)
    forward = found is not None and found.nonfinite > 0
    collapsed = it.collapsed_at is not None
    where = _overflow(ev, it)
    layer = where if isinstance(where, Overflow) and not forward else None
    output = where if isinstance(where, Overflow) and where.forward_in else None
    found_fix = _output_fix(ev, output) if output is not None and forward else \
        _layer_fix(ev, layer) if layer is not None else FIND_OVERFLOW
    fixes = [*_bf16(ev, speedup), found_fix]
    if forward or collapsed or layer is not None:
        fixes.reverse()  # no type or scale helps a value that is not finite: find it first
    if not (forward or collapsed):
        fixes.append(_grow_slower(it, _scaler_setting(ev, it.rank, "growth_interval")))
    why = ""
    if collapsed:
        why = f"; the scale fell below 1 (to {scale_words(it.scale_lowest)}): inf/NaN " \
              "whatever the scale"
    if forward:
        why += f"; {found.nonfinite if found else 0} losses were already inf/NaN: the forward " \
               "pass overflows"
    if output is not None:
        why += f"; {_forward_words(output)}"
    if layer is not None:
        why += f"; {_overflow_words(layer)}"
    calibrating = f" ({it.calibrating} calibrating at the start)" if it.calibrating else ""
    return Finding(
        id="steps.skipped", category="compute",
        severity="warning" if later >= WARN_SHARE * it.count else "info",
        title=f"The GradScaler skipped {it.skipped} of {it.count} iterations{calibrating}: "
              f"{later} later ones wasted their forward and backward, {share:.0%} of the run"
              f"{why}",
        evidence=_evidence(ev, it), fixes=tuple(fixes), estimated_speedup=speedup)


def _calibration(ev: Evidence, it: Iterations) -> Finding:
    share = it.calibrating_share
    speedup = 1.0 / max(1e-9, 1.0 - share) if share > 0 else None
    start, settled = it.scale_first, it.scale_settled
    scales = f", from a scale of {scale_words(start)} down to {scale_words(settled)}" \
        if start == start and settled == settled else ""
    fix = Fix(
        title=f"Start the scale where it settled: init_scale={_power(settled)}",
        why="the scaler halves its scale at each overflow until gradients fit: a start near the "
            "scale it settles at skips none of the first iterations",
        code=f"scaler = torch.amp.GradScaler(init_scale={_power(settled)})",
        estimated_speedup=speedup)
    return Finding(
        id="steps.skipped", category="compute", severity="info",
        title=f"The GradScaler skipped its first {it.calibrating} of {it.count} iterations "
              f"calibrating{scales}: {share:.0%} of the run",
        evidence=_evidence(ev, it), fixes=(fix, *_bf16(ev, speedup)),
        estimated_speedup=speedup)
