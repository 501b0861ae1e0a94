"""The optimizer as its own cost: Adam, AdamW, SGD or Adagrad stepping each parameter in turn
(a Python loop of small ops per tensor) or as lists (foreach), where one fused kernel per step
does the same update. Named where the optimizer step is a real share of the step, with the
fused (or foreach) setting as the fix and an ``apply`` that ``doctor try`` can measure.

The collectives a step of the optimizer issues (a sharded optimizer's parameter broadcasts, a
gradient norm's all-reduce: the profiler window's calls of phase ``optimizer``) are its time but
not its update's: a fused kernel takes none of them off, so their exposed share of the window's
steps is left out of the optimizer's share (said in the evidence); communication's findings have
them.
"""

from __future__ import annotations

from doctor.analyse.evidence import Evidence
from doctor.rules.base import rule
from doctor.verdict import Finding, Fix

FUSABLE = ("Adam", "AdamW", "SGD", "Adagrad")  # fused=True on CUDA, and on CPU from torch 2.4
OPTIMIZER_SHARE = 0.15  # of the step, before the optimizer's cost gets a word
WARN_SHARE = 0.30
#: The share of the optimizer's time each change takes away, from what was measured here (Adam
#: over 200 small tensors on a CPU, torch 2.13: 9.7 ms a step one tensor at a time, 6.8 ms
#: foreach, 2.9 ms fused) and in the issue's jobs (fused: 1.55x on a step the optimizer took
#: 56 % of); rounded down.
FUSED_CUTS, FOREACH_CUTS = 0.6, 0.3


@rule("optimizer.unfused", needs=("ledger", "optimizers"))
def unfused(ev: Evidence) -> list[Finding]:
    ledger, optimizers = ev.ledger, ev.optimizers
    assert ledger is not None and optimizers is not None  # guaranteed by needs
    wall = float(ledger["wall_s"].sum())
    collectives = collectives_in_step_share(ev)
    share = max(float(ledger["optimizer_s"].sum()) / wall - collectives, 0.0) \
        if wall > 0 else 0.0
    rows = optimizers[optimizers["optimizer"].isin(FUSABLE) & ~optimizers["fused"].eq(True)]
    if share < OPTIMIZER_SHARE or rows.empty:
        return []
    row = rows.sort_values("tensors", ascending=False).iloc[0]
    name, device, tensors = str(row["optimizer"]), str(row["device"]), int(row["tensors"])
    foreach = row["foreach"] is True or (row["foreach"] is None and device == "cuda")
    how = "as lists (foreach)" if foreach else "one tensor at a time"
    fused_here = device == "cuda" or _at_least(ev.job.torch_version, (2, 4))
    fixes = []
    if fused_here:
        fixes.append(Fix(
            title=f"Fused {name}: fused=True",
            why=f"one kernel updates every parameter where {name} now steps {how}; it runs "
                f"on {device or 'this device'} with this torch",
            code=f"optimizer = torch.optim.{name}(model.parameters(), lr=lr, fused=True)",
            apply={"optimizer": {"fused": True}},
            estimated_speedup=_speedup(share, FUSED_CUTS)))
    if not foreach:
        fixes.append(Fix(
            title=f"{name} over lists: foreach=True",
            why="the same update as a few list ops instead of a loop over the tensors",
            code=f"optimizer = torch.optim.{name}(model.parameters(), lr=lr, foreach=True)",
            apply={"optimizer": {"foreach": True}},
            estimated_speedup=_speedup(share, FOREACH_CUTS)))
    if not fixes:
        return []
    return [Finding(
        id="optimizer.unfused", category="compute",
        severity="warning" if share >= WARN_SHARE else "info",
        title=f"The optimizer step takes {share:.0%} of the step"
              + (" (its collectives apart)" if collectives > 0 else "")
              + f": {name} over {tensors} tensors, {how}",
        evidence={"optimizer": name, "optimizer_share": share, "tensors": tensors,
                  "device": device, "foreach": row["foreach"], "fused": row["fused"],
                  **({"collectives_in_step_share": collectives} if collectives > 0 else {})},
        fixes=tuple(fixes), estimated_speedup=fixes[0].estimated_speedup)]


def collectives_in_step_share(ev: Evidence) -> float:
    """The exposed time of the collectives issued inside the optimizer's step, as a share of
    the profiler window's steps (the ranks' mean; 0 without a window's collectives): a share,
    since the window's steps and calls run slower than the ledger's."""
    window = ev.window
    if window is None or window.empty or "dur_s" not in window:
        return 0.0
    shares = []
    for rank, c in (ev.comms or {}).items():
        mine = window[window["rank"] == rank] if "rank" in window else window
        step = float(mine["dur_s"].mean()) if len(mine) else 0.0
        if c.steps > 0 and step > 0 and {"phase", "exposed_s"} <= set(c.calls.columns):
            inside = float(c.calls.loc[c.calls["phase"] == "optimizer", "exposed_s"].sum())
            shares.append(min(inside / c.steps / step, 1.0))
    return sum(shares) / len(shares) if shares else 0.0


def _speedup(share: float, cuts: float) -> float:
    return 1.0 / max(1e-9, 1.0 - cuts * share)


def _at_least(version: str | None, wanted: tuple[int, int]) -> bool:
    """Whether torch ``version`` ("2.13.0+cpu") is ``wanted`` or newer (False: unknown)."""
    try:
        major, minor = (int(part) for part in (version or "").split("+")[0].split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= wanted
