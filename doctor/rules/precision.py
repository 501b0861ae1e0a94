"""Mixed precision's own costs and failures (doctor.analyse.mixed):

- ``precision.casts``: autocast's casts take a tenth of the op time or more. Where the device
  runs no 16-bit type faster than fp32 (a CPU without a measured bf16 roof, a GPU without Tensor
  Cores), autocast costs the casts and buys nothing: leave it off. Where it runs another 16-bit
  type fast (fp16 on an Ampere GPU: bf16 needs no scaler), that one. Otherwise the casts are the
  price of the 16-bit maths: torch.compile fuses them into their neighbours.
- ``loss.nonfinite``: a backward() ran on a loss that was inf or NaN and the optimizer stepped
  anyway (no GradScaler to skip it): the weights took inf/NaN updates from that step on.
"""

from __future__ import annotations

from doctor.analyse.evidence import Evidence
from doctor.analyse.mixed import RankPrecision
from doctor.rules.base import rule
from doctor.rules.ops import ops_speedup
from doctor.rules.sound import PLAIN_COMPILE
from doctor.verdict import Finding, Fix

MIN_CAST_SHARE = 0.10  # of the ops' time
WARN_CAST_SHARE = 0.25


@rule("precision.casts", needs=("precision", "ops"))
def casts(ev: Evidence) -> list[Finding]:
    found = ev.precision
    ops = ev.ops
    assert found is not None and ops is not None  # guaranteed by needs
    device = ev.job.device
    costly = [p for p in found.values() if p.autocasts_to(device) and p.cast_share is not None
              and p.cast_share >= MIN_CAST_SHARE and p.rank in ops]
    if not costly:
        return []
    p = max(costly, key=lambda x: x.cast_share or 0.0)
    share = p.cast_share or 0.0
    dtype = p.autocasts_to(device) or ""
    fast = ev.job.precision
    estimate = ops_speedup(ev, share, ops[p.rank])
    fixes = []
    if fast.device == device and fast.dtype is None:
        fixes.append(Fix(
            title="Leave autocast off",
            why=f"this {'GPU' if device == 'cuda' else 'CPU'} runs no 16-bit type faster than "
                f"fp32 ({fast.why}): autocast to {dtype} costs its casts ({share:.0%} of the op "
                "time) and buys nothing; the estimate counts the casts alone",
            code=f"with torch.autocast(\"{device}\", dtype=torch.{dtype}, enabled=False):\n"
                 "    loss = loss_fn(model(x), y)  # or drop the autocast",
            estimated_speedup=estimate))
    elif fast.device == device and fast.dtype not in (None, dtype):
        fixes.append(Fix(
            title=f"Autocast to {fast.dtype} instead",
            why=f"{fast.why}" + (": no GradScaler needed" if not fast.scaler else ""),
            code=fast.autocast_code()))
    fixes.append(Fix(
        title="Fuse the casts: torch.compile",
        why="compiled, each cast is fused into the op that reads it instead of writing a 16-bit "
            "copy of the tensor first",
        code=PLAIN_COMPILE, estimated_speedup=estimate))
    return [Finding(
        id="precision.casts", category="compute",
        severity="warning" if share >= WARN_CAST_SHARE else "info",
        title=f"Autocast's casts to {dtype} take {share:.0%} of the op time "
              f"(aten::copy_, aten::_to_copy)",
        evidence={"rank": p.rank, "autocast": f"{device}:{dtype}", "cast_share_of_ops": share,
                  "cast_s": p.cast_s, "device_runs_fast": fast.dtype or "none"},
        fixes=tuple(fixes), estimated_speedup=estimate)]


@rule("loss.nonfinite", needs=("precision",))
def nonfinite(ev: Evidence) -> list[Finding]:
    found = ev.precision
    assert found is not None  # guaranteed by needs
    bad = [p for p in found.values() if p.nonfinite_stepped > 0]
    if not bad:
        return []
    p: RankPrecision = max(bad, key=lambda x: x.nonfinite_stepped)
    kind = "NaN" if p.nan >= p.nonfinite - p.nan else "inf"
    step = f" from step {p.first_nonfinite_step}" if p.first_nonfinite_step else ""
    return [Finding(
        id="loss.nonfinite", category="compute", severity="critical",
        title=f"The optimizer stepped on {p.nonfinite_stepped} losses that were {kind}{step}: "
              "the weights took non-finite updates",
        evidence={"rank": p.rank, "nonfinite_losses": p.nonfinite, "nan": p.nan,
                  "stepped_on": p.nonfinite_stepped, "first_step": p.first_nonfinite_step},
        fixes=(Fix(
            title="Find the op that makes it",
            why="anomaly detection names the forward op whose backward produced the first inf or "
                "NaN (slow: for a few steps only); a log of 0, a division by a norm of 0 or a "
                "learning rate too high for the loss scale are the usual causes",
            code="with torch.autograd.detect_anomaly():\n    loss = loss_fn(model(x), y)\n"
                 "    loss.backward()"),
               Fix(
            title="Stop at the first non-finite loss, every few steps",
            why="training on after an inf/NaN loss spoils every weight it touches; reading the "
                "loss is a host sync on a GPU, so read it every few steps, not every one",
            code="if step % 50 == 0 and not torch.isfinite(loss):  # one sync every 50 steps\n"
                 "    raise RuntimeError(f\"loss {loss.item()} at step {step}\")")))]
