"""Shared by the sample jobs: the job's own step timing, printed as one JSON line at the end.

The benchmarks read that line to compare the job bare and under doctor with the job's own clock.
"""

from __future__ import annotations

import json
import statistics
import time


class StepTimer:
    def __init__(self) -> None:
        self.t_start = time.perf_counter()
        self.last = self.t_start
        self.steps: list[float] = []

    def step(self) -> None:
        now = time.perf_counter()
        self.steps.append(now - self.last)
        self.last = now

    def report(self, **extra: object) -> None:
        steady = self.steps[len(self.steps) // 5:] or self.steps
        print(json.dumps({
            "median_step_s": statistics.median(steady) if steady else None,
            "loop_s": time.perf_counter() - self.t_start,
            "steps": len(self.steps), **extra,
        }), flush=True)
