"""What the GC probe (doctor.probes.gc_pauses) adds to a garbage collection and to a step.

    python bench/gc_cost.py                 # 30 rounds (--rounds N)

In this one process, blocks alternate between ``bare`` (no probe) and ``probe`` (the probe's
callback in ``gc.callbacks``; one Session for the whole bench, recording into a temporary run
directory, its ``gc`` ring made before the first block), and each keeps its smallest block
(the least disturbed) over ``--rounds`` rounds. Times are the CPU time of this thread
(``time.thread_time_ns``):

* a young collection (``gc.collect(0)`` of an almost empty generation 0): the callback's cost
  on the collections that come hundreds of times a second, counted and never written;
* a full collection (``gc.collect()``): the callback's cost where it writes a ring record, beside
  the collection's own;
* a step that makes cyclic garbage (``--objects`` small lists in one cycle, alive through the
  step, freed by a later collection): what the probe adds to such a step, whose allocations
  set off the collector's automatic collections (about 30 a step, a full one now and then).
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from doctor.probes.gc_pauses import GcProbe
from doctor.record.session import STEP_MANUAL, Session


def young(n: int) -> int:
    t0 = time.thread_time_ns()
    for _ in range(n):
        gc.collect(0)
    return time.thread_time_ns() - t0


def full(n: int) -> int:
    t0 = time.thread_time_ns()
    for _ in range(n):
        gc.collect()
    return time.thread_time_ns() - t0


def step_maker(objects: int) -> Callable[[int], int]:
    def steps(n: int) -> int:
        t0 = time.thread_time_ns()
        for _ in range(n):
            garbage: list[Any] = []
            for _ in range(objects):
                garbage.append([garbage])
            del garbage
        return time.thread_time_ns() - t0
    return steps


def block(run: Callable[[int], int], n: int, probe: GcProbe | None) -> tuple[float, int]:
    """(CPU ns per call, collections the probe saw) of ``n`` calls, with the probe's callback
    in gc.callbacks or without."""
    if probe is None:
        return run(n) / n, 0
    before = sum(probe.collections)
    gc.callbacks.append(probe._callback)
    try:
        ns = run(n)
    finally:
        gc.callbacks.remove(probe._callback)
    return ns / n, sum(probe.collections) - before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--objects", type=int, default=20_000, help="cyclic objects a step makes")
    args = ap.parse_args()
    cases = {"young collection": (young, 2000), "full collection": (full, 50),
             f"step of {args.objects} cyclic objects": (step_maker(args.objects), 20)}
    best: dict[tuple[str, bool], float] = {}
    seen: dict[str, int] = {}
    tmp = tempfile.mkdtemp(prefix="doctor-gc-")
    session = Session(Path(tmp), rank=0, window_start=10**9)
    probe = GcProbe(session)  # one Session for the whole bench, recording (its ring made)
    session.mark_step(STEP_MANUAL)
    session.record_interval("gc", 0, 0)
    try:
        for _ in range(args.rounds):
            for name, (run, n) in cases.items():
                for probed in (False, True):
                    ns, collections = block(run, n, probe if probed else None)
                    best[name, probed] = min(best.get((name, probed), float("inf")), ns)
                    if probed:
                        seen[name] = collections // n
    finally:
        session.close()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"load average {os.getloadavg()[0]:.2f}; CPU us per call (smallest block of "
          f"{args.rounds} rounds); threshold {gc.get_threshold()}")
    for name in cases:
        bare, probed = best[name, False], best[name, True]
        print(f"  {name:<34} bare {bare / 1e3:9.2f}   probe {probed / 1e3:9.2f}   "
              f"adds {(probed - bare) / 1e3:6.2f} us ({seen.get(name, 0)} collections a call)")


if __name__ == "__main__":
    main()
