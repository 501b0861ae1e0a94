"""Shared by the sample jobs: the job's own step timing, printed as one JSON line at the end.

The benchmarks read that line to compare the job bare and under doctor with the job's own clock.
``AblationTimer`` times a job that flips its switch back and forth inside one process
(``--ablate N``), so that both sides of an ablation see the same machine: from one process to
the next, this kind of machine can change speed by more than the switch does. It also times
``--switch-after N``: the switch off for the first N steps and on for the rest, which
bench/accuracy.py runs under doctor, so that doctor's analysis of the first part and the speedup
measured across the switch come from the same process.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterator


class StepTimer:
    def __init__(self) -> None:
        self.t_start = time.perf_counter()
        self.last = self.t_start
        self.steps: list[float] = []
        self.trains: list[float] = []

    def train(self, seconds: float) -> None:
        """The training part (forward, backward, optimizer) of the step being timed."""
        self.trains.append(seconds)

    def start_block(self, switched: bool) -> None:
        """The next step is timed from now (a plain run is one block, of one side)."""
        self.last = time.perf_counter()

    def step(self) -> None:
        now = time.perf_counter()
        self.steps.append(now - self.last)
        self.last = now

    def report(self, **extra: object) -> None:
        steady = self.steps[len(self.steps) // 5:] or self.steps
        trains = self.trains[len(self.trains) // 5:] or self.trains
        print(json.dumps({
            "median_step_s": statistics.median(steady) if steady else None,
            "median_train_s": statistics.median(trains) if trains else None,
            "loop_s": time.perf_counter() - self.t_start,
            "steps": len(self.steps), **extra,
        }), flush=True)


def blocks(steps: int, block: int) -> Iterator[tuple[bool, int]]:
    """(switched, length) of alternating blocks, the switch off first, ``steps`` in all."""
    done, switched = 0, False
    while done < steps:
        length = min(block, steps - done)
        yield switched, length
        done += length
        switched = not switched


def plan(steps: int, ablate: int, switched: bool, switch_after: int = 0
         ) -> tuple[StepTimer | AblationTimer, list[tuple[bool, int]]]:
    """The timer and the (switched, length) blocks of a job's run: with ``--ablate`` > 0 both
    sides in alternation; with ``--switch-after`` N > 0 the first N steps without the switch and
    the rest with it; else one block of the side asked for."""
    if ablate > 0:
        return AblationTimer(ablate), list(blocks(steps, ablate))
    if 0 < switch_after < steps:
        return AblationTimer(switch_after), [(False, switch_after), (True, steps - switch_after)]
    return StepTimer(), [(switched, steps)]


def side_lengths(sides: list[tuple[bool, int]]) -> dict[bool, int]:
    """The longest block of each side a run has: what a side's data must hold."""
    out: dict[bool, int] = {}
    for side, length in sides:
        out[side] = max(out.get(side, 0), length)
    return out


class AblationTimer:
    """Steps timed in alternating blocks with the job's switch off and on. The first ``warm``
    steps of each block are not counted (a fresh DataLoader iterator starts its workers and
    fills its queue there). Jobs that time the training part of their steps (``train``) also
    get its median on each side: a stage's removal can speed up the rest of the step too (its
    caches stay warm), which an estimate made from the slow side cannot see."""

    def __init__(self, block: int, warm: int = 3) -> None:
        self.block, self.warm = block, warm
        self.times: dict[bool, list[float]] = {False: [], True: []}
        self.trains: dict[bool, list[float]] = {False: [], True: []}
        self.t_start = time.perf_counter()
        self.switched, self.in_block, self.last = False, 0, self.t_start

    def start_block(self, switched: bool) -> None:
        self.switched, self.in_block, self.last = switched, 0, time.perf_counter()

    def train(self, seconds: float) -> None:
        """The training part (forward, backward, optimizer) of the step being timed."""
        if self.in_block >= self.warm:
            self.trains[self.switched].append(seconds)

    def step(self) -> None:
        now = time.perf_counter()
        if self.in_block >= self.warm:
            self.times[self.switched].append(now - self.last)
        self.in_block += 1
        self.last = now

    def report(self, **extra: object) -> None:
        off, on = self.times[False], self.times[True]
        train_off, train_on = self.trains[False], self.trains[True]
        print(json.dumps({
            "median_step_s": statistics.median(off) if off else None,
            "switched_median_step_s": statistics.median(on) if on else None,
            "train_median_s": statistics.median(train_off) if train_off else None,
            "switched_train_median_s": statistics.median(train_on) if train_on else None,
            "loop_s": time.perf_counter() - self.t_start,
            "steps": len(off) + len(on), "ablation_block": self.block, **extra,
        }), flush=True)
