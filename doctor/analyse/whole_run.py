"""The whole run's steps, however long it ran: the ``run_steps`` buckets (doctor.record.run_steps)
of each rank's training process, beside the ledger that the detailed rings allow.

The detailed rings keep each process's newest records (RING_CAPACITY each), so the ledger of a
run of many hours holds its newest steps only; the buckets count every step, with each bucket's
shortest and longest. From them: how many steps the run had against the ledger's (a note when
the ledger holds fewer), the long stalls among the steps the ledger lost (a step of at least
MIN_STALL_S and STALL_FACTOR times the median, as doctor.analyse.stalls finds them in the
ledger), and the step chart's whole run (reports.step_chart).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from doctor.analyse.stalls import MAJOR_SHARE, MAX_FINDINGS, MIN_STALL_S, STALL_FACTOR
from doctor.analyse.steps import training_processes
from doctor.store.rundata import RunData
from doctor.verdict import Finding

NS = 1e-9
#: The ledger holds the whole run when it has at least this share of the counted steps.
WHOLE = 0.98
#: Where a stall among the steps the ledger lost fell (a Stall's ``where``).
LOST = "the steps before those the rings kept"
#: The rings of rare intervals, which hold a whole long run, that name a stall's cause.
TIMED = {"checkpoint": "checkpoint", "gc": "garbage collection", "evaluation": "evaluation"}


@dataclass(frozen=True)
class RankRun:
    """One rank's buckets of steps, in time order: seconds from the run's start."""

    rank: int
    start_s: np.ndarray  # each bucket's first step's start
    end_s: np.ndarray  # its last step's end
    steps: np.ndarray  # steps in the bucket
    min_s: np.ndarray  # its shortest step
    max_s: np.ndarray  # its longest step
    max_end_s: np.ndarray  # when the longest ended

    @property
    def total(self) -> int:
        return int(self.steps.sum())

    @property
    def first_step(self) -> np.ndarray:
        """The step number (from 1) of each bucket's first step."""
        return np.concatenate([[1], 1 + np.cumsum(self.steps)[:-1]]).astype(np.int64)

    def step_at(self, t_s: np.ndarray) -> np.ndarray:
        """The step number under each time (s from the run's start), between buckets' ends."""
        ends = np.concatenate([[self.start_s[0]], self.end_s])
        counts = np.concatenate([[0], np.cumsum(self.steps)])
        return np.interp(np.asarray(t_s, dtype=np.float64), ends, counts)

    def mean_s(self) -> np.ndarray:
        return (self.end_s - self.start_s) / np.maximum(self.steps, 1)

    def longest_step(self) -> np.ndarray:
        """The step number of each bucket's longest step, about: the bucket's other steps at
        their mean, those after the longest end its bucket."""
        others = (self.end_s - self.start_s - self.max_s) / np.maximum(self.steps - 1, 1)
        after = np.round((self.end_s - self.max_end_s) / np.maximum(others, 1e-12))
        return self.first_step + self.steps - 1 - np.minimum(after, self.steps - 1).astype(
            np.int64)


@dataclass(frozen=True)
class LostStall:
    """A long stall among the steps the ledger does not hold (found in a bucket's longest)."""

    rank: int
    step: int  # about: the bucket's steps are not told apart
    seconds: float
    end_s: float  # when it ended (s from the run's start)
    median_s: float
    during: str = ""  # what took most of it ("checkpoint", "evaluation", ...), or ""


@dataclass(frozen=True)
class WholeRun:
    ranks: dict[int, RankRun]
    ledger_steps: dict[int, int]  # per rank, the steps of the ledger
    #: per rank, what the sparse rings timed (they hold the whole run): name -> (start_s, end_s)
    timed: dict[int, dict[str, tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)

    def lost(self, rank: int) -> int:
        """The steps of ``rank`` the ledger lacks (the rings kept the newest)."""
        r = self.ranks.get(rank)
        return max(0, r.total - self.ledger_steps.get(rank, 0)) if r is not None else 0

    def timed_steps(self, rank: int, name: str) -> np.ndarray:
        """The step numbers where each of ``rank``'s ``name`` intervals (TIMED) began."""
        r = self.ranks.get(rank)
        starts = self.timed.get(rank, {}).get(name, (np.zeros(0), np.zeros(0)))[0]
        return np.round(r.step_at(starts)) if r is not None and len(starts) else np.zeros(0)

    def partial(self) -> bool:
        """Whether some rank's ledger lacks a part of its steps."""
        return any(self.ledger_steps.get(k, 0) < WHOLE * r.total for k, r in self.ranks.items())


def whole_run(run: RunData, ledger: pd.DataFrame) -> WholeRun | None:
    """The buckets of each rank's training process; None where none recorded them (a trace, a
    run of an older doctor)."""
    if run.run_steps.empty:
        return None
    ranks: dict[int, RankRun] = {}
    timed: dict[int, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    for rank, steps in training_processes(run).items():
        rows = run.rows("run_steps", steps.process)
        if rows.empty:
            continue
        rows = rows.sort_values("t0_ns", kind="stable")
        origin = run.record.t0_ns.get(steps.process[0], 0)

        def secs(name: str, rows: pd.DataFrame = rows, origin: int = origin) -> np.ndarray:
            return (rows[name].to_numpy(np.int64) - origin) * NS

        ranks[rank] = RankRun(rank, secs("t0_ns"), secs("t1_ns"),
                              rows["steps"].to_numpy(np.int64),
                              rows["min_ns"].to_numpy(np.float64) * NS,
                              rows["max_ns"].to_numpy(np.float64) * NS, secs("max_t_ns"))
        timed[rank] = {"evaluation": _other_passes(run, steps.process, origin)}
        for name in ("checkpoint", "gc"):
            t0, t1, _key = run.intervals_of(steps.process, name)
            timed[rank][name] = ((t0 - origin) * NS, (t1 - origin) * NS)
    if not ranks:
        return None
    held = ledger["rank"].to_numpy(np.int64) if not ledger.empty else np.zeros(0, np.int64)
    ranks_held, counts = np.unique(held, return_counts=True)
    return WholeRun(ranks, {int(k): int(v) for k, v in zip(ranks_held, counts, strict=True)},
                    timed)


def _other_passes(run: RunData, process: tuple[int, int, int], origin: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The passes over each DataLoader but the training one (the one whose passes took the
    most time): from an iterator made (``loader_iter``) to that loader's exhaustion
    (``loader_end``), in seconds from the run's start: evaluation, most often."""
    made, _t1, made_key = run.intervals_of(process, "loader_iter")
    _t0, ended, ended_key = run.intervals_of(process, "loader_end")
    passes: dict[int, tuple[list[int], list[int]]] = {}
    for key in np.unique(made_key):
        ends = np.sort(ended[ended_key == key])
        starts = made[made_key == key]
        at = np.searchsorted(ends, starts)
        ok = at < len(ends)
        passes[int(key)] = (list(starts[ok]), list(ends[at[ok]]))
    if len(passes) < 2:
        return np.zeros(0), np.zeros(0)
    train = max(passes, key=lambda k: sum(e - s for s, e in zip(*passes[k], strict=True)))
    firsts = [s for k, (ss, _) in passes.items() if k != train for s in ss]
    lasts = [e for k, (_, es) in passes.items() if k != train for e in es]
    return ((np.asarray(firsts, np.float64) - origin) * NS,
            (np.asarray(lasts, np.float64) - origin) * NS)


def _during(whole: WholeRun, rank: int, t0: float, t1: float) -> str:
    """What the sparse rings timed over most of [t0, t1] (a checkpoint, a collection), or ""."""
    for name, (starts, ends) in whole.timed.get(rank, {}).items():
        took = np.clip(np.minimum(ends, t1) - np.maximum(starts, t0), 0, None).sum()
        if took >= 0.5 * (t1 - t0):
            return TIMED[name]
    return ""


def lost_stalls(whole: WholeRun, ledger: pd.DataFrame) -> list[LostStall]:
    """The long stalls in buckets that end before the ledger's first step (of the same rank)."""
    found = []
    for rank, r in whole.ranks.items():
        rows = ledger[ledger["rank"] == rank] if not ledger.empty else ledger
        first = float(rows["start_s"].min()) if len(rows) else np.inf
        median = float(np.median(r.mean_s()))
        before = (r.end_s <= first) & (r.max_s >= MIN_STALL_S) & (r.max_s >= STALL_FACTOR
                                                                   * median)
        step = r.longest_step()
        found += [LostStall(rank, int(step[i]), float(r.max_s[i]), float(r.max_end_s[i]), median,
                            _during(whole, rank, r.max_end_s[i] - r.max_s[i], r.max_end_s[i]))
                  for i in np.flatnonzero(before)]
    return sorted(found, key=lambda s: -s.seconds)


def lost_stall_findings(whole: WholeRun | None, ledger: pd.DataFrame,
                        run_s: float | None) -> list[Finding]:
    """A ``steps.stall`` finding for each of the longest long stalls among the steps the
    ledger lost that nothing explains (a checkpoint, an evaluation, a collection): it is never
    hidden by the rings' keeping the newest steps. Steps are numbered over the whole run."""
    if whole is None or not whole.partial():
        return []
    out = []
    for s in [s for s in lost_stalls(whole, ledger) if not s.during][:MAX_FINDINGS]:
        whole_s = run_s if run_s and run_s > 0 else float(whole.ranks[s.rank].end_s[-1])
        share = min(1.0, s.seconds / whole_s) if whole_s > 0 else 0.0
        times = s.seconds / s.median_s if s.median_s > 0 else float("inf")
        out.append(Finding(
            id="steps.stall", category="other",
            severity="warning" if share >= MAJOR_SHARE else "info",
            title=f"About step {s.step:,} of the run (rank {s.rank}), {s.end_s / 3600:.1f} h "
                  f"in, a step took {s.seconds:.1f} s, {times:.0f}x the mean step "
                  f"({s.median_s * 1e3:.0f} ms): {share:.2%} of the run",
            evidence={"rank": s.rank, "step": s.step, "seconds": round(s.seconds, 3),
                      "median_s": round(s.median_s, 4), "times_median": round(times, 1),
                      "share_of_run": round(share, 4), "ended_h": round(s.end_s / 3600, 3),
                      "where": LOST, "ranks": [s.rank]}))
    return out


def whole_run_notes(whole: WholeRun | None, ledger: pd.DataFrame) -> list[str]:
    """What the ledger holds of a long run, and the long stalls among the steps it lost."""
    if whole is None or not whole.partial():
        return []
    notes = []
    for rank, r in whole.ranks.items():
        held = whole.ledger_steps.get(rank, 0)
        if held < WHOLE * r.total:
            notes.append(
                f"Rank {rank} ran {r.total:,} steps over {r.end_s[-1] / 3600:.1f} h; its rings "
                f"keep the newest records, so the shares and findings are over its last "
                f"{held:,} steps, and the step chart and the search for long stalls over all "
                "of them.")
    stalls = lost_stalls(whole, ledger)
    named = [s for s in stalls if s.during]
    unexplained = len(stalls) - len(named)
    if unexplained > MAX_FINDINGS:
        notes.append(f"{unexplained - MAX_FINDINGS} more long stalls before the steps analysed "
                     "than the findings name.")
    for what in sorted({s.during for s in named}):
        these = [s for s in named if s.during == what]
        notes.append(f"Before the steps analysed, {len(these)} long step(s) of {what} "
                     f"(the longest {max(s.seconds for s in these):.1f} s).")
    return notes
