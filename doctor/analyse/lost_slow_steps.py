"""Slow steps among the steps the rings no longer hold, each with its cause: the slow-step groups
(doctor.analyse.causes) over the whole run, not only its newest steps.

The detailed rings keep each process's newest records, so over a run of many hours the step
table holds its last steps only; the ``run_steps`` buckets (doctor.analyse.whole_run) count every
step, with each bucket's longest step and when it ended. A bucket that ended before the table's
first step and whose longest step is over SPIKE times the rank's median step (the table's) holds
a slow step: that one, at its place in the run (its step number over the whole run, about), gets
its cause from the causes whose records hold the whole run (the collector's pauses, the
checkpoints, logging calls of 1 ms or more, compilations, other processes on the cores), or
UNEXPLAINED. Only the longest step of each bucket (BUCKET_STEPS steps) is known: a bucket with
two slow steps counts one, so the counts are at least what the run had. The first bucket is
warm-up and is left out. The steps' time of those buckets joins the time the groups' shares of
the steps are of.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from doctor.analyse.causes import SPIKE, Cause, SlowStep, attributed
from doctor.analyse.stalls import MIN_STALL_S, STALL_FACTOR
from doctor.analyse.whole_run import LOST, WholeRun


def lost_slow_steps(whole: WholeRun | None, table: pd.DataFrame, causes: Sequence[Cause]
                    ) -> tuple[list[SlowStep], float]:
    """(the slow steps of the buckets before each rank's table, those buckets' steps' time);
    none where the table holds the whole run."""
    if whole is None or not whole.partial():
        return [], 0.0
    found: list[SlowStep] = []
    lost_s = 0.0
    for rank, r in whole.ranks.items():
        rows = table[table["rank"] == rank] if not table.empty else table
        if rows.empty or whole.lost(rank) <= 0:
            continue
        steady = rows["analyzed"].to_numpy(bool) if "analyzed" in rows else \
            np.ones(len(rows), dtype=bool)
        wall = rows["wall_s"].to_numpy(np.float64)
        median = float(np.median(wall[steady] if steady.any() else wall))
        first = float(rows["start_s"].min())
        before = r.end_s <= first
        before[:1] = False  # the run's first bucket: warm-up
        lost_s += float((r.end_s - r.start_s)[before].sum())
        slow = before & (r.max_s > SPIKE * median)
        number = r.longest_step()
        for i in np.flatnonzero(slow):
            seconds = float(r.max_s[i])
            found.append(attributed(
                rank, int(number[i]), float(r.max_end_s[i]) - seconds, seconds, median, LOST,
                seconds >= STALL_FACTOR * median and seconds >= MIN_STALL_S, causes))
    return found, lost_s


__all__ = ["lost_slow_steps"]
