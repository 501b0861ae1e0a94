"""From the attempts of a try to its result: measured speedups and what each try came to.

Pure: it reads the attempts' step times and what the job said it ran with, and never runs
anything. Each round runs the baseline, then every candidate, so that a machine that drifts
moves both sides of a round alike: the speedup of a candidate in a round is the baseline's time a
step over the candidate's (above 1 is faster), its measured speedup the median over the rounds
and its spread their lowest and highest. (The ratio over all the rounds' steps pooled, which a
drifting machine skews towards its slow rounds, is kept as ``pooled``.)

A run's time a step is its pace (doctor.step_pace): the mean of its analysed steps, the fastest
and the slowest 1 % left out (a lone stray stall; a loader's bursts stay in), never the median
(two workers on a 32 ms batch measured 33 ms, as if one, in one try of two).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from doctor.step_pace import pace

#: Below this change of the median step (either way) a try "changed nothing measurable",
#: unless every round agrees on the direction.
NOISE = 0.03


@dataclass
class AttemptResult:
    """One run of the job, stopped after its steps (doctor.tries.attempt)."""

    arm: str  # "baseline" or a candidate id
    round: int
    run_dir: str
    exit_code: int
    stopped: bool  # doctor stopped it at its steps (so its exit status is not an error)
    timed_out: bool = False
    step_s: list[float] = field(default_factory=list)  # the analysed steps' wall times
    tried: dict[str, dict[str, Any]] = field(default_factory=dict)  # setting -> what the job had
    errors: list[str] = field(default_factory=list)
    stderr_tail: str = ""
    duration_s: float = 0.0
    steps_run: int = 0
    startup_s: float = 0.0  # from its start to its first step
    steps_time_s: float = 0.0  # the time of all its steps, warm-up included
    steal_share: float | None = None  # of the machine's CPU time, taken by its hypervisor

    @property
    def failed(self) -> bool:
        return self.timed_out or (self.exit_code != 0 and not self.stopped)

    @property
    def pace_s(self) -> float | None:
        return pace(self.step_s)


@dataclass
class Measured:
    speedup: float | None
    low: float | None
    high: float | None
    per_round: list[float]
    baseline_s: float | None
    candidate_s: float | None
    steps: int  # candidate steps measured
    pooled: float | None = None  # the pooled steps' medians, baseline over candidate


def measure(baseline: Sequence[AttemptResult], candidate: Sequence[AttemptResult]) -> Measured:
    base_rounds = {a.round: a for a in baseline if not a.failed and a.step_s}
    per_round = []
    for a in candidate:
        b = base_rounds.get(a.round)
        if b is not None and not a.failed and a.step_s and b.pace_s and a.pace_s:
            per_round.append(b.pace_s / a.pace_s)
    b_steps = [s for a in base_rounds.values() for s in a.step_s]
    c_steps = [s for a in candidate if not a.failed for s in a.step_s]
    b_med = pace(b_steps)
    c_med = pace(c_steps)
    pooled = b_med / c_med if b_med and c_med else None
    speedup = statistics.median(per_round) if per_round else pooled
    return Measured(speedup, min(per_round) if per_round else None,
                    max(per_round) if per_round else None, per_round, b_med, c_med,
                    len(c_steps), pooled)


def reached(apply: Mapping[str, Mapping[str, Any]], attempts: Sequence[AttemptResult]
            ) -> tuple[list[str], list[str]]:
    """The settings no process of the job ever met (a DataLoader never built), and those it
    already had as tried, in every process that met them."""
    seen: dict[str, list[dict[str, Any]]] = {}
    for a in attempts:
        for setting, entry in a.tried.items():
            seen.setdefault(setting, []).append(entry)
    never, already = [], []
    for section, values in apply.items():  # env: doctor try noted what the job had
        for key, value in values.items():
            setting = f"{section}.{key}"
            entries = seen.get(setting)
            if not entries:
                never.append(setting)
                continue
            had = []  # what the job would have run with: its own later call, else its value
            for entry in entries:
                had += [entry["asked"]] if "asked" in entry else list(entry.get("job", []))
            if had and all(v == value for v in had):
                already.append(f"{key}={value}")
    return never, already


def outcome(apply: Mapping[str, Mapping[str, Any]], attempts: Sequence[AttemptResult],
            measured: Measured) -> tuple[str, str]:
    """(outcome, why): failed | not applied | unchanged | faster | slower | no change."""
    failed = [a for a in attempts if a.failed]
    if failed:
        a = failed[0]
        what = "ran past its time and was stopped" if a.timed_out \
            else f"exited with status {a.exit_code}"
        return "failed", f"the job {what} with this setting ({len(failed)} of {len(attempts)} " \
                         "tries); its stderr is kept"
    never, already = reached(apply, attempts)
    errors = sorted({e for a in attempts for e in a.errors})
    if never:
        return "not applied", (f"the job never built what {', '.join(never)} applies to"
                               + (f" ({'; '.join(errors)})" if errors else ""))
    total = sum(len(v) for v in apply.values())
    if already and len(already) == total:
        return "unchanged", f"the job already runs with {', '.join(already)}: nothing to try"
    s, lo, hi = measured.speedup, measured.low, measured.high
    if s is None:
        return "no steps", "the tries recorded no steps to compare"
    agree_up = lo is not None and lo > 1.0 and len(measured.per_round) > 1
    agree_down = hi is not None and hi < 1.0 and len(measured.per_round) > 1
    if s >= 1.0 + NOISE and (agree_up or len(measured.per_round) <= 1):
        return "faster", f"measured {s:.2f}x"
    if s <= 1.0 - NOISE and (agree_down or len(measured.per_round) <= 1):
        return "slower", f"measured {s:.2f}x: the job is slower with it"
    return "no change", f"measured {s:.2f}x: within the spread of the repeats"


#: An attempt whose first half of steps ran this much slower than its second had not settled
#: (workers still starting, caches still filling) when it was stopped.
SETTLING = 1.25
MIN_HALF = 4  # steps in each half for the comparison to say anything


def unsettled(attempts: Sequence[AttemptResult]) -> str | None:
    """Why the attempts were too short to tell (their first half of steps much slower than the
    second: a start-up not yet behind them), or None."""
    worst = 1.0
    for a in attempts:
        half = len(a.step_s) // 2
        if a.failed or half < MIN_HALF:
            continue
        first, second = pace(a.step_s[:half]), pace(a.step_s[half:])
        if first and second:
            worst = max(worst, first / second)
    if worst < SETTLING:
        return None
    return (f"its runs were too short to tell: the first half of their steps ran {worst:.1f}x "
            "slower than the second (workers starting, caches filling); run with more --steps")


#: Baseline rounds further apart than this (slowest over fastest median step), or a
#: hypervisor taking more than STOLEN of the CPU time, make a try "unsteady".
UNSTEADY_SPREAD = 1.25
STOLEN = 0.15


def steadiness(baseline: Sequence[AttemptResult], attempts: Sequence[AttemptResult]
               ) -> str | None:
    """Why the machine's own speed changed during the try (its results are then unsure), or
    None when it held still as far as can be seen."""
    medians = [a.pace_s for a in baseline if a.pace_s]
    why = []
    if len(medians) > 1 and max(medians) > UNSTEADY_SPREAD * min(medians):
        why.append(f"the job as it is ran at {min(medians) * 1e3:.0f}-{max(medians) * 1e3:.0f} "
                   "ms a step from one round to the next")
    stolen = max((a.steal_share or 0.0 for a in attempts), default=0.0)
    if stolen > STOLEN:
        why.append(f"the hypervisor took up to {stolen:.0%} of the CPU time from this machine")
    if not why:
        return None
    return ("the machine's speed changed during the try (" + "; ".join(why) + "): the "
            "measured speedups are unsure; run it again with more --repeat, on a quieter machine")


def ratio(measured: float | None, estimate: float | None) -> float | None:
    """Measured over estimated speedup (1.0: the estimate was right)."""
    return measured / estimate if measured and estimate else None
