"""Where the causes of slow steps come from, and the slow steps of a run with their causes.

CAUSE_SOURCES lists the functions that make a Cause (doctor.analyse.causes) of what a run
recorded, each ``(run, stages) -> Cause | None`` (None: the run has none of it): the garbage
collector's pauses (doctor.analyse.gc_pauses), other processes on the machine's cores
(doctor.analyse.machine_load) and torch.compile's compilations (doctor.analyse.compiles, whose
findings are doctor.rules.compiles'); then the run's phases (evaluation, checkpoints, epoch starts:
doctor.analyse.phase_steps), whose findings are doctor.rules.phases'. A wait for another rank
(doctor.analyse.peer_waits) is found last, from the others' slow steps. A new cause is one more
function here; its slow steps then get its name, its group and, from doctor.rules.causes, its
finding.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from doctor.analyse.causes import Cause, SlowSteps, slow_steps, with_lost
from doctor.analyse.compiles import compile_cause
from doctor.analyse.gc_pauses import GcSummary, gc_cause, gc_summaries
from doctor.analyse.lost_slow_steps import lost_slow_steps
from doctor.analyse.machine_load import machine_cause
from doctor.analyse.peer_waits import with_peer_waits
from doctor.analyse.phase_steps import phase_causes
from doctor.analyse.spike_calls import step_sites
from doctor.analyse.stages import Stages
from doctor.analyse.stalls import export_seconds
from doctor.analyse.whole_run import WholeRun
from doctor.store.rundata import RunData

CauseSource = Callable[[RunData, Stages], "Cause | None"]

CAUSE_SOURCES: tuple[CauseSource, ...] = (
    lambda run, stages: gc_cause(run, stages.ranks),
    lambda run, stages: machine_cause(run, stages.ranks),
    lambda run, stages: compile_cause(run, stages.ranks),
)


def find_causes(run: RunData, stages: Stages) -> list[Cause]:
    """Every cause the run recorded, in CAUSE_SOURCES' order."""
    return [*(c for source in CAUSE_SOURCES if (c := source(run, stages)) is not None),
            *phase_causes(stages.phases)]


def run_slow_steps(run: RunData, stages: Stages, run_s: float | None,
                   whole: WholeRun | None = None) -> SlowSteps:
    """The run's slow steps, each with its cause (doctor.analyse.causes.slow_steps; then a wait
    for another rank's slow step, doctor.analyse.peer_waits, for those still unexplained), the calls
    that the stack samples saw in those they cover (doctor.analyse.spike_calls), and, where the
    rings hold only the run's newest steps, the slow steps of the others (``whole``'s buckets:
    doctor.analyse.lost_slow_steps)."""
    causes = find_causes(run, stages)
    slow = with_peer_waits(
        slow_steps(stages.table, causes, export_seconds(stages.ranks), run_s), stages.table,
        {rank: r.node for rank, r in stages.ranks.items()})
    sites = step_sites(run, stages.ranks, stages.table,
                       ((s.rank, s.step, s.start_s, s.seconds) for s in slow.steps))
    lost, lost_s = lost_slow_steps(whole, stages.table, causes)
    return with_lost(replace(slow, sites=sites) if sites else slow, lost, lost_s)


def run_gc(run: RunData, stages: Stages, run_s: float | None) -> dict[int, GcSummary]:
    """Each rank's garbage collections (doctor.analyse.gc_pauses)."""
    return gc_summaries(run, stages.ranks, stages.table, run_s)


__all__ = ["CAUSE_SOURCES", "CauseSource", "find_causes", "run_gc", "run_slow_steps"]
