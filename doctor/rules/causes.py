"""Slow steps with a known cause: one finding per cause, with the fix that fits it.

The analysis gives each slow step its cause (doctor.analyse.causes); here each group of them
becomes a finding: the garbage collector's (``steps.gc``: freeze the heap after setup and
collect on a schedule, with the speedup its measured pauses allow), other processes on the
machine's cores (``steps.machine``: the machine, not the job), a wait for another rank's slow
step (``steps.peer``, with the fix of what made that rank slow), and any other cause with the fix
it carries (``steps.cause.NAME``). Slow steps with no known cause stay doctor.rules.other's
``steps.spikes``; those of a phase (evaluation, checkpoints, epoch starts) are
doctor.rules.phases'.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from doctor.analyse.causes import UNEXPLAINED, CauseGroup, SlowSteps
from doctor.analyse.compiles import COMPILE
from doctor.analyse.evidence import Evidence
from doctor.analyse.gc_pauses import GC, GcSummary
from doctor.analyse.machine_load import MACHINE, MACHINE_FIX
from doctor.analyse.peer_waits import PEER
from doctor.analyse.phases import PHASES
from doctor.rules.base import rule
from doctor.verdict import Finding, Fix

MIN_SHARE = 0.1  # a cause's slow steps cost this share of the steps' time: a finding (as
# doctor.rules.other's spikes)...
MIN_GC_SHARE = 0.02  # ...or this much for the garbage collector (its fix is a few lines)
WARNING_SHARE = 0.1
LISTED = 10  # step numbers listed in the evidence

GC_FREEZE = Fix(
    title="Freeze the heap after setup and collect when you choose",
    why="A full collection scans every object the process holds (the model's modules, the "
        "dataset's Python objects, caches): the larger the heap, the longer the pause, at "
        "whatever step the allocations tip it over. gc.freeze() moves what exists after setup "
        "out of the collector's reach; collecting yourself every N steps keeps the pause at a "
        "step you choose (and short: only what was made since).",
    code="import gc\n\n# once setup is done (model, optimizer and data built; after step 1):\n"
         "gc.collect()\ngc.freeze()     # what is alive now is never scanned again\n"
         "gc.disable()    # no collection at a random step...\n\n"
         "for step, batch in enumerate(loader):\n    train_step(batch)\n"
         "    if step % 1000 == 0:\n        gc.collect()   # ...one at a step you choose")
GC_THRESHOLD = Fix(
    title="Or make full collections rarer",
    why="A full collection runs after a number of younger ones (the third threshold); raising "
        "it spaces the pauses out without changing the code of the loop.",
    code="import gc\n\ngc.freeze()\ngc.set_threshold(50_000, 50, 1000)")


@rule("steps.causes", needs=("slow_steps",))
def slow_step_causes(ev: Evidence) -> list[Finding]:
    slow = ev.slow_steps
    assert slow is not None
    out = []
    for group in slow.groups:
        if group.cause in (UNEXPLAINED, COMPILE, *PHASES):  # their own rules speak for them
            continue
        if group.steps_share < (MIN_GC_SHARE if group.cause == GC else MIN_SHARE):
            continue
        if group.cause == GC:
            out.append(gc_finding(group, ev.gc or {}))
        elif group.cause == MACHINE:
            out.append(machine_finding(group))
        elif group.cause == PEER:
            out.append(peer_finding(group, slow))
        else:
            out.append(cause_finding(group, slow))
    return out


def _evidence(group: CauseGroup) -> dict[str, object]:
    steps = sorted(group.steps, key=lambda s: (s.step, s.rank))
    return {"cause": group.cause, "slow_steps": group.count,
            "steps": [s.step for s in steps[:LISTED]], "over_median_s": group.over_s,
            "share_of_run": group.share, "share_of_steps": group.steps_share,
            "cause_s": group.lost_s,
            "slowest_step_s": max(s.seconds for s in group.steps),
            "median_step_s": steps[0].median_s}


def _severity(group: CauseGroup) -> str:
    return "warning" if group.steps_share >= WARNING_SHARE else "info"


def gc_finding(group: CauseGroup, gc: Mapping[int, GcSummary]) -> Finding:
    """The garbage collector's slow steps: their pauses, and gc.freeze with its speedup."""
    summary = max(gc.values(), key=lambda g: g.in_steps_s, default=None)
    words = [w for s in group.steps for w in s.words]
    longest = summary.longest_s if summary is not None else 0.0
    speedup = summary.speedup if summary is not None and summary.in_steps_s > 0 else \
        1.0 / max(1e-9, 1.0 - group.steps_share)
    evidence = {**_evidence(group), **({"collections": summary.collections,
                                        "full_collections": summary.full,
                                        "pause_s": summary.pause_s,
                                        "longest_pause_s": longest,
                                        "gc_share_of_run": summary.share}
                                       if summary is not None else {})}
    return Finding(
        id="steps.gc", category="other", severity=_severity(group),
        title=f"{group.count} slow step{'s' if group.count > 1 else ''} paused by Python's "
              f"garbage collector cost {group.over_s:.1f} s, {_shares(group)}"
              + (f" (longest pause {longest * 1e3:.0f} ms)" if longest > 0 else ""),
        evidence={**evidence, "what": words[:3]},
        fixes=(Fix(GC_FREEZE.title, GC_FREEZE.why, GC_FREEZE.code, estimated_speedup=speedup),
               GC_THRESHOLD),
        estimated_speedup=speedup)


def machine_finding(group: CauseGroup) -> Finding:
    """Slow steps while other processes held the cores: the machine's, not the job's."""
    words = [w for s in group.steps for w in s.words]
    return Finding(
        id="steps.machine", category="other", severity=_severity(group),
        title=f"{group.count} slow step{'s' if group.count > 1 else ''} ran while other "
              f"processes kept the cores busy: {group.over_s:.1f} s, {_shares(group)} (the "
              "machine, not the job)",
        evidence={**_evidence(group), "what": words[:3]}, fixes=(MACHINE_FIX,),
        estimated_speedup=1.0 / max(1e-9, 1.0 - group.steps_share))


def peer_finding(group: CauseGroup, slow: SlowSteps) -> Finding:
    """Slow steps that waited for another rank's slow step: whose, and what made it slow."""
    words = list(dict.fromkeys(w for s in group.steps for w in s.words))
    cause = slow.causes.get(group.cause)
    fixes: tuple[Fix, ...] = (cause.fix,) if cause and cause.fix else ()
    if cause is not None and cause.follows == GC and fixes:  # the collector's fix is here
        fixes = (replace(fixes[0], code=GC_FREEZE.code), GC_THRESHOLD)
    first = f" ({words[0]})" if words else ""
    return Finding(
        id="steps.peer", category="other", severity=_severity(group),
        title=f"{group.count} slow step{'s' if group.count > 1 else ''} waited for another "
              f"rank's slow step{first}: {group.over_s:.1f} s, {_shares(group)}",
        evidence={**_evidence(group), "what": words[:3],
                  "waited_for": cause.follows if cause else None},
        fixes=fixes, estimated_speedup=1.0 / max(1e-9, 1.0 - group.steps_share))


def _shares(group: CauseGroup) -> str:
    """"18% of the step time (8% of the run)": of what the spikes cost, and of the run."""
    return f"{group.steps_share:.0%} of the step time ({group.share:.0%} of the run)"


def cause_finding(group: CauseGroup, slow: SlowSteps) -> Finding:
    """Any other cause's slow steps, with the fix the cause carries."""
    cause = slow.causes.get(group.cause)
    return Finding(
        id=f"steps.cause.{group.cause}", category="other", severity=_severity(group),
        title=f"{group.count} slow step{'s' if group.count > 1 else ''} overlapped "
              f"{group.label}: {group.over_s:.1f} s, {_shares(group)}",
        evidence=_evidence(group), fixes=(cause.fix,) if cause and cause.fix else (),
        estimated_speedup=1.0 / max(1e-9, 1.0 - group.steps_share))
