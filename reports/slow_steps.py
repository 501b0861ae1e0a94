"""The slow steps by cause, one line per cause (the terminal summary and the report's step-time
section): how many steps, their time over the median and its share of the run (for those with
no known cause, the calls their stack samples were in: doctor.analyse.spike_calls), and the
garbage collector's pauses over the run (doctor.analyse.analysis.Sections' ``slow_steps`` and
``gc``; the figures are worked out there, formatted here)."""

from __future__ import annotations

from doctor.analyse.analysis import Sections
from doctor.analyse.causes import UNEXPLAINED
from doctor.analyse.spike_calls import calls_of

SAID_SHARE = 0.01  # the collector's line, where it paused 1 % of the run or more (or slow steps)


def slow_step_lines(sections: Sections) -> list[str]:
    """One line per cause of slow steps (the largest first), then one for the collector (where
    it paused SAID_SHARE of the run or more, or there were slow steps)."""
    lines = []
    slow = sections.slow_steps
    for g in slow.groups if slow is not None else ():
        steps = sorted({s.step for s in g.steps})
        shown = ", ".join(str(n) for n in steps[:5]) + (", ..." if len(steps) > 5 else "")
        what = "no known cause" if g.cause == UNEXPLAINED else g.label
        machine = " (the machine, not the job)" if g.machine else ""
        lines.append(f"slow steps, {what}{machine}: {g.count} (step{'s' if len(steps) > 1 else ''}"
                     f" {shown}), {g.over_s:.2f} s over the median step, {g.share:.1%} of the "
                     "run")
        calls = calls_of(slow.sites, g.steps) \
            if slow is not None and g.cause == UNEXPLAINED else None
        if calls is not None:
            lines.append(f"  stack samples of {calls.steps} of them: {calls.words()}")
    for c in list(sections.gc.values())[:1]:
        if c.collections is None or (c.share < SAID_SHARE and not lines):
            continue  # a collector that paused the run for next to nothing goes unsaid
        pause = f"{c.pause_s * 1e3:.0f} ms" if c.pause_s is not None else "unknown"
        lines.append(f"garbage collector, rank {c.rank}: {c.collections} collections "
                     f"({c.full} full), {pause} paused, {c.share:.1%} of the run; longest "
                     f"pause {c.longest_s * 1e3:.0f} ms")
    return lines
