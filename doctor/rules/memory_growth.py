"""Memory rules over growth (doctor.analyse.memory_growth): memory that climbs step over step
(a graph kept across steps, a list that keeps tensors), with its rate and the step at which it
would reach the limit; DataLoader workers whose own memory grows as they read a dataset of
Python objects (copy-on-read: each object's reference count writes to the page it sits in).
"""

from __future__ import annotations

from doctor.analyse.evidence import Evidence
from doctor.rules.base import rule
from doctor.units import human_bytes
from doctor.verdict import Finding, Fix

#: Growth that would fill the memory left within this many times the steps observed is critical.
CRITICAL_HORIZON = 20


@rule("memory.creep", needs=("memory_use",))
def creep(ev: Evidence) -> list[Finding]:
    mem = ev.memory_use
    assert mem is not None  # guaranteed by needs
    grown = [m for m in mem.ranks.values() if m.growth is not None]
    if not grown:
        return []
    m = max(grown, key=lambda r: r.growth.bytes_per_step if r.growth else 0.0)
    g = m.growth
    assert g is not None
    left = m.headroom_bytes
    steps_left = g.steps_to(left) if left is not None else None
    limit_step = g.last_step + steps_left if steps_left is not None else None
    observed = max(g.last_step - g.first_step, 1)
    title = (f"Memory grows by {human_bytes(g.bytes_per_step)} every step on rank {m.rank} "
             f"({g.source}: {human_bytes(g.start_bytes)} at step {g.first_step}, "
             f"{human_bytes(g.end_bytes)} at step {g.last_step})")
    if limit_step is not None:
        title += f"; at this rate it runs out near step {limit_step}"
    return [Finding(
        id="memory.creep", category="memory",
        severity="critical" if steps_left is not None and steps_left <= CRITICAL_HORIZON
        * observed else "warning",
        title=title,
        evidence={"rank": m.rank, "source": g.source, "bytes_per_step": g.bytes_per_step,
                  "bytes_per_s": g.bytes_per_s, "first_step": g.first_step,
                  "last_step": g.last_step, "start_bytes": g.start_bytes,
                  "end_bytes": g.end_bytes, "r2": g.r2, "headroom_bytes": left,
                  "limit_step": limit_step, "ranks_growing": len(grown)},
        fixes=_creep_fixes(g.bytes_per_step, g.end_bytes - g.start_bytes, m.device == "cuda"),
    )]


@rule("memory.worker_growth", needs=("memory_use",))
def worker_growth(ev: Evidence) -> list[Finding]:
    mem = ev.memory_use
    assert mem is not None  # guaranteed by needs
    if not mem.workers:
        return []
    w = max(mem.workers, key=lambda g: g.total_growth_bytes)
    loaders = ev.loaders
    mine = loaders[loaders["rank"] == w.rank] if loaders is not None and not loaders.empty \
        else None
    dataset = str(mine["dataset"].iloc[0]) if mine is not None and len(mine) and \
        mine["dataset"].iloc[0] else "the dataset"
    persistent = bool(mine["persistent_workers"].iloc[0]) if mine is not None and len(mine) \
        else False
    return [Finding(
        id="memory.worker_growth", category="memory", severity="warning",
        title=(f"Each DataLoader worker's own memory grows by "
               f"{human_bytes(w.median_growth_bytes)} over its life ({w.growing} of "
               f"{w.workers} workers, {human_bytes(w.total_growth_bytes)} in all): "
               "copy-on-read of the dataset's Python objects"),
        evidence={"rank": w.rank, "workers": w.workers, "growing": w.growing,
                  "median_growth_bytes": w.median_growth_bytes,
                  "total_growth_bytes": w.total_growth_bytes,
                  "median_rate_bytes_s": w.median_rate_bytes_s,
                  "median_life_s": w.median_life_s, "dataset": dataset,
                  "persistent_workers": persistent},
        fixes=(
            Fix(title=f"Hold {dataset}'s samples in numpy arrays or tensors, not Python lists",
                why="a forked worker shares the parent's pages until it writes to them, and "
                    "reading a Python object writes its reference count: every list, dict or "
                    "str read is copied into each worker. One array holds the same data in a "
                    "few objects, and reading it writes nothing: "
                    f"about {human_bytes(w.total_growth_bytes)} less over the workers",
                code="self.data = np.asarray(samples, dtype=np.float32)  # not a list of lists\n"
                     "# strings: one np.array of bytes plus an offsets array",
                frees_bytes=w.total_growth_bytes),
        ),
    )]


def _creep_fixes(per_step: float, grown: float, gpu: bool) -> tuple[Fix, ...]:
    """Keep numbers or detached tensors across steps; on a GPU without ``.item()`` or ``.cpu()``
    each step (a host sync each: doctor's own gpu.host_sync advice), read them when logging."""
    keep = ("total_loss += loss.detach()  # not: total_loss += loss; on the GPU, no sync per "
            "step\nif step % log_every == 0:\n    print(total_loss.item() / log_every)"
            if gpu else "total_loss += loss.item()  # not: total_loss += loss")
    how = "`.detach()`" if gpu else "`.item()` (or `.detach()`)"
    return (
        Fix(title="Keep numbers, not tensors, across steps",
            why=f"a loss summed as a tensor keeps each step's autograd graph alive, and with "
                f"it the activations it saved: {human_bytes(per_step)} more every step here. "
                f"In the training loop, add {how} where a tensor outlives its step"
                + ("; `.item()` every step would wait for the GPU each time" if gpu else ""),
            code=keep, frees_bytes=grown),
        Fix(title="Store what you log detached",
            why="a list that keeps tensors from every step (losses, outputs, metrics) grows "
                "without bound; keep Python floats or detached copies"
                + (", and copy them to the CPU when you log, not every step" if gpu else ""),
            code="history.append(loss.detach())  # .cpu() / .item() when you log"
            if gpu else "history.append(loss.detach().cpu())  # or loss.item()"),
    )
