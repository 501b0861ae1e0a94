"""Memory that grows over the run: a straight-line fit of bytes against steps that holds over
the whole stretch, not a jump.

A kept graph (``total_loss += loss``) or a Python list that gains a tensor every step adds the
same bytes each step; a cache filling once, or the profiler window's own buffers, adds them once.
So growth is said only when the slope is positive over the stretch, the fit explains most of
the variation, and the two halves of the stretch grow at a similar rate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIB = float(1 << 20)
MIN_SAMPLES = 6
MIN_STEPS = 10
MIN_R2 = 0.8
HALF_RATIO = 3.0  # the halves' slopes within this factor of each other
MIN_GROWTH_BYTES = 32 * MIB
MIN_GROWTH_SHARE = 0.05  # of the level at the stretch's start
MIN_WORKER_GROWTH_BYTES = 64 * MIB


@dataclass(frozen=True)
class Growth:
    """Bytes growing linearly with steps over ``first_step``..``last_step``."""

    source: str  # what grew: "CUDA allocated" | "RSS"
    bytes_per_step: float
    bytes_per_s: float
    first_step: int
    last_step: int
    start_bytes: float  # the fitted level at the first and last step
    end_bytes: float
    r2: float
    samples: int

    def steps_to(self, headroom_bytes: float) -> int | None:
        """Steps after the last one until ``headroom_bytes`` more are used."""
        if self.bytes_per_step <= 0 or headroom_bytes <= 0:
            return None
        return int(headroom_bytes / self.bytes_per_step)



def _slope(x: np.ndarray, y: np.ndarray) -> float:
    dx = x - x.mean()
    var = float((dx * dx).sum())
    return float((dx * (y - y.mean())).sum() / var) if var > 0 else 0.0


def linear_growth(steps: np.ndarray, values: np.ndarray, seconds: np.ndarray, source: str
                  ) -> Growth | None:
    """The growth of ``values`` (bytes) sampled at ``steps`` (and ``seconds``), or None when it
    is not steady growth (see the module docstring)."""
    keep = np.isfinite(steps) & np.isfinite(values)
    x, y, t = steps[keep].astype(float), values[keep].astype(float), seconds[keep].astype(float)
    order = np.argsort(x, kind="stable")
    x, y, t = x[order], y[order], t[order]
    if len(x) < MIN_SAMPLES or x[-1] - x[0] < MIN_STEPS:
        return None
    slope = _slope(x, y)
    intercept = float(y.mean() - slope * x.mean())
    fitted = intercept + slope * x
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(((y - fitted) ** 2).sum()) / total if total > 0 else 0.0
    start, end = float(fitted[0]), float(fitted[-1])
    if slope <= 0 or r2 < MIN_R2 or end - start < max(MIN_GROWTH_BYTES,
                                                      MIN_GROWTH_SHARE * max(start, 0.0)):
        return None
    half = len(x) // 2
    first, second = _slope(x[:half + 1], y[:half + 1]), _slope(x[half:], y[half:])
    if first <= 0 or second <= 0 or max(first, second) / min(first, second) > HALF_RATIO:
        return None
    dt = t[-1] - t[0]
    return Growth(source=source, bytes_per_step=slope,
                  bytes_per_s=(end - start) / dt if dt > 0 else float("nan"),
                  first_step=int(x[0]), last_step=int(x[-1]), start_bytes=start, end_bytes=end,
                  r2=r2, samples=len(x))


@dataclass(frozen=True)
class WorkerGrowth:
    """The DataLoader workers of one rank whose own (unshared) memory grew while their RSS did
    not: pages copied from the parent (copy-on-read), not memory they allocated."""

    rank: int
    workers: int  # workers measured (two readings or more)
    growing: int  # of them, those whose copied bytes reached MIN_WORKER_GROWTH_BYTES
    median_growth_bytes: float  # own memory gained per worker, over its life
    total_growth_bytes: float  # over every measured worker
    median_rate_bytes_s: float
    median_life_s: float



#: Own memory counts as copied when RSS grew by at most this share of it meanwhile.
COPIED_RSS_SHARE = 0.5


def worker_growth(rank: int, readings: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
                  ) -> WorkerGrowth | None:
    """From each worker's (seconds, own bytes, RSS) readings, the first taken as it started:
    the own memory it gained, counted when its RSS grew by at most COPIED_RSS_SHARE of that
    (a page copied from the parent turns from shared to own; one allocated adds to RSS too);
    found when at least half of the workers copied MIN_WORKER_GROWTH_BYTES or more."""
    growths, rates, lives = [], [], []
    for t, own, rss in readings:
        keep = np.isfinite(own) & np.isfinite(rss)
        t, own, rss = t[keep], own[keep], rss[keep]
        if len(own) < 2:
            continue
        peak = int(np.argmax(own))
        gained = float(own[peak] - own[0])
        copied = gained > 0 and float(rss[peak] - rss[0]) <= COPIED_RSS_SHARE * gained
        life = float(t[-1] - t[0])
        growths.append(gained if copied else 0.0)
        rates.append(gained / float(t[peak] - t[0]) if copied and t[peak] > t[0] else 0.0)
        lives.append(life)
    growing = sum(g >= MIN_WORKER_GROWTH_BYTES for g in growths)
    if not growths or growing * 2 < len(growths):
        return None
    return WorkerGrowth(rank=rank, workers=len(growths), growing=growing,
                        median_growth_bytes=float(np.median(growths)),
                        total_growth_bytes=float(sum(growths)),
                        median_rate_bytes_s=float(np.median(rates)),
                        median_life_s=float(np.median(lives)))
