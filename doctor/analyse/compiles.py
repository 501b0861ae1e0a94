"""What torch.compile cost each rank: its compilations (probes/compile.py, from TorchDynamo's
own callbacks), the first ones apart from the recompilations, their seconds against the run,
the frames recompiled most, the steps they fell in, and why it recompiled and where it broke the
graph (doctor.analyse.compile_causes).

The steps a compilation fell in are no steady steps: the step table flags them (``compiling``)
and leaves them out of the shares (doctor.analyse.step_table). Nothing here decides anything:
doctor.rules.compiles reads it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from doctor.analyse.causes import Cause, Intervals
from doctor.analyse.compile_causes import (
    GraphBreak,
    RecompileCause,
    graph_breaks,
    recompile_causes,
)
from doctor.analyse.steps import WINDOW, RankSteps
from doctor.store.records import compile_frame
from doctor.store.rundata import RunData

NS = 1e-9
COMPILE = "compile"  # the cause of slow steps a compilation fell in (doctor.analyse.causes)
#: TorchDynamo's default recompile limit (torch._dynamo.config.recompile_limit, formerly
#: cache_size_limit): a frame compiled this many times runs eagerly from then on.
RECOMPILE_LIMIT = 8


@dataclass(frozen=True)
class Compiles:
    """One rank's torch.compile compilations."""

    rank: int
    compilations: int  # Dynamo compilations of frames (first ones and recompilations)
    recompilations: int  # of them, those of a frame compiled before
    first_s: float  # seconds in the first compilation of each frame (and what it deferred)
    recompile_s: float  # seconds in recompilations (and what they deferred)
    run_s: float  # the training process's steps and compilations, first start to last end
    steps_compiling: int  # steps a compilation fell in (left out of the shares)
    most_recompiled: tuple[int, int]  # (frame, its recompilations) of the frame recompiled most
    causes: tuple[RecompileCause, ...] = ()  # recompilations by kind of failed guard
    breaks: tuple[GraphBreak, ...] = ()  # graph breaks, the most met first

    @property
    def recompile_share(self) -> float:
        return self.recompile_s / self.run_s if self.run_s > 0 else 0.0

    @property
    def first_share(self) -> float:
        return self.first_s / self.run_s if self.run_s > 0 else 0.0

    @property
    def at_limit(self) -> bool:
        """Whether a frame reached Dynamo's recompile limit (it runs eagerly from then on)."""
        return self.most_recompiled[1] + 1 >= RECOMPILE_LIMIT


def compiles(run: RunData, ranks: Mapping[int, RankSteps],
             table: pd.DataFrame) -> dict[int, Compiles]:
    """Per rank whose training process compiled, its compilations."""
    out: dict[int, Compiles] = {}
    for rank, r in ranks.items():
        t0, t1, key = run.intervals_of(r.process, "compile")
        if not len(t0) or not len(r.ends_ns):
            continue
        seconds = (t1 - t0) * NS
        # a deferred compilation (negative key) belongs to the Dynamo compilation before it
        nth = np.zeros(len(key), dtype=np.int64)
        recompiled: Counter[int] = Counter()
        each: dict[tuple[int, int], float] = {}  # (frame, nth) -> its seconds
        last = frame = 0
        for i, k in enumerate(key):
            if k >= 0:
                frame, last = compile_frame(int(k))
                if last:
                    recompiled[frame] += 1
            nth[i] = last
            each[(frame, last)] = each.get((frame, last), 0.0) + float(seconds[i])
        said = run.rows("compile_causes", r.process)
        dynamo = key >= 0
        mine = table[table["rank"] == rank]
        out[rank] = Compiles(
            rank=rank, compilations=int(dynamo.sum()), recompilations=int((nth[dynamo] > 0).sum()),
            first_s=float(seconds[nth == 0].sum()), recompile_s=float(seconds[nth > 0].sum()),
            run_s=float((max(int(r.ends_ns[-1]), int(t1.max()))
                         - min(int(r.starts_ns[0]), int(t0.min()))) * NS),
            steps_compiling=int(mine["compiling"].sum()),
            most_recompiled=max(recompiled.items(), key=lambda kv: kv[1], default=(0, 0)),
            causes=recompile_causes(said, each), breaks=graph_breaks(said))
    return out


def compile_cause(run: RunData, ranks: Mapping[int, RankSteps]) -> Cause | None:
    """Each rank's compilations as a Cause of slow steps (None: nothing compiled): a step a
    recompilation fell in is slow for that, not for periodic work in the loop. Its finding is
    doctor.rules.compiles'."""
    intervals = {}
    for rank, r in ranks.items():
        t0, t1, key = run.intervals_of(r.process, "compile")
        if r.kind == WINDOW or not len(t0):
            continue
        origin = run.record.t0_ns.get(r.node, 0)
        words = []
        for a, b, k in zip(t0, t1, key, strict=True):
            frame, nth = compile_frame(int(k)) if k >= 0 else (-1, 0)
            what = ("compilation deferred to the first call" if k < 0 else
                    f"recompilation {nth} of frame {frame}" if nth else
                    f"first compilation of frame {frame}")
            words.append(f"{what}, {(b - a) * NS:.2f} s")
        intervals[rank] = Intervals.of((t0 - origin) * NS, (t1 - origin) * NS, words=words)
    return Cause(COMPILE, "torch.compile compiling", intervals) if intervals else None
