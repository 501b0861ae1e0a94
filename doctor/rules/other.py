"""Time outside the measured parts of a step: logging, checkpoints, evaluation, Python."""

from __future__ import annotations

import numpy as np

from doctor.analyse.causes import UNEXPLAINED
from doctor.analyse.evidence import Evidence
from doctor.analyse.spike_calls import SpikeCalls, calls_of
from doctor.analyse.spike_content import spike_content
from doctor.rules.base import rule
from doctor.verdict import Finding, Fix

OTHER_SHARE = 0.2
SPIKE = 3.0  # a step this many times the median is a spike (checkpoint, evaluation)


@rule("steps.other", needs=("ledger",))
def other_time(ev: Evidence) -> list[Finding]:
    ledger = ev.ledger
    assert ledger is not None
    wall = ledger["wall_s"].to_numpy(dtype=float)
    total = float(wall.sum())
    if total <= 0:
        return []
    share = float(ledger["other"].sum()) / total
    median = float(np.median(wall))
    spikes = wall > SPIKE * median
    spike_share = float((wall[spikes] - median).sum()) / total
    findings = []
    if share - spike_share >= OTHER_SHARE:  # spread over ordinary steps, not the spikes below
        findings.append(Finding(
            id="steps.other", category="other", severity="warning",
            title=f"{share:.0%} of step time is outside forward, backward, optimizer and input",
            evidence={"other_share": share, "median_step_s": median},
            fixes=(Fix(
                title="Look for per-step work that is not training",
                why="Logging that syncs (loss.item() every step), metrics on the host, "
                    "checkpoints and evaluation inside the loop all land here.",
                code="if step % 100 == 0:\n    print(loss.item())  # not every step",
            ),),
            estimated_speedup=1.0 / max(1e-9, 1.0 - share),
        ))
    # the spikes with a known cause are that cause's (doctor.rules.causes); the rest are here
    known = ev.slow_steps.explained() if ev.slow_steps is not None else set()
    caused = _pairs_in(ledger["rank"].to_numpy(np.int64), ledger["step"].to_numpy(np.int64),
                       known)
    unknown = spikes & ~caused
    unknown_share = float((wall[unknown] - median).sum()) / total
    if unknown_share >= 0.1:
        said = "" if not (spikes & caused).any() else " with no known cause"
        extra = {} if not said else {"explained_steps": int((spikes & caused).sum())}
        content = spike_content(ledger, unknown)
        calls = _unexplained_calls(ev)
        every = f", every {content.every} steps" if content.every else ""
        what = _WHAT.get(content.state or "", "")
        part = content.parts[content.state] if content.parts and content.state else 0.0
        findings.append(Finding(
            id="steps.spikes", category="other", severity="warning",
            title=f"{int(unknown.sum())} slow steps{said} (over {SPIKE:.0f}x the median"
                  f"{every}) cost {unknown_share:.0%} of the time"
                  + (f"; in their extra time the training thread {what.format(part)}"
                     if what else "")
                  + (f"; stack samples of {calls.steps} of them: {calls.words()}"
                     if calls else ""),
            evidence={"spike_steps": int(unknown.sum()), "spike_share": unknown_share,
                      "median_step_s": median, "slowest_step_s": float(wall[unknown].max()),
                      **extra, **content.to_evidence(),
                      **(calls.to_evidence() if calls else {})},
            fixes=_FIXES.get(content.state or "", (PERIODIC,)),
            estimated_speedup=1.0 / max(1e-9, 1.0 - unknown_share),
        ))
    return findings


def _unexplained_calls(ev: Evidence) -> SpikeCalls | None:
    """Where the stack samples saw the slow steps with no known cause (those they cover)."""
    slow = ev.slow_steps
    if slow is None or not slow.sites:
        return None
    return calls_of(slow.sites, [s for s in slow.steps if s.cause == UNEXPLAINED])


def _pairs_in(ranks: np.ndarray, steps: np.ndarray, known: set[tuple[int, int]]) -> np.ndarray:
    """Whether each (rank, step) is one of ``known`` (vectorised: a ledger of millions)."""
    if not known:
        return np.zeros(len(ranks), dtype=bool)
    pairs = np.array(sorted(known), dtype=np.int64)
    out = np.zeros(len(ranks), dtype=bool)
    for rank in np.unique(pairs[:, 0]):
        mine = ranks == rank
        out[mine] = np.isin(steps[mine], pairs[pairs[:, 0] == rank, 1])
    return out


PERIODIC = Fix(
    title="Make periodic work rarer or asynchronous",
    why="Work that some steps do and others do not (logging that reduces metrics, evaluation, "
        "checkpoints, a cache rebuilt every so often) lands in those steps.",
    code="if step % 1000 == 0:\n    torch.save(model.state_dict(), path)")
WAITS = Fix(
    title="Find what the loop waits on in those steps",
    why="The training thread was neither on a core nor waiting for one: it slept in a read, a "
        "lock, a network call, a wait on another process or a sleep. A dump of its stack while "
        "a slow step runs names the call; then make it asynchronous, cache it, or move it off "
        "the loop.",
    code="py-spy dump --pid PID          # while a slow step runs: where the thread waits\n"
         "# or, in the job: dump every thread's stack whenever a step takes over 5 s\n"
         "import faulthandler, sys\n"
         "faulthandler.dump_traceback_later(5, repeat=True, file=sys.stderr)  # each step:\n"
         "faulthandler.cancel_dump_traceback_later()  # ...and re-arm after it")
CORES = Fix(
    title="Leave the training thread a core",
    why="The training thread was ready to run but waited for a core: other threads of the job "
        "(intra-op threads, DataLoader workers) or other processes held them in those steps.",
    code="torch.set_num_threads(max(1, os.cpu_count() - num_workers - 1))")
_FIXES = {"blocked": (WAITS, PERIODIC), "running": (PERIODIC,), "runnable": (CORES, PERIODIC)}
_WHAT = {"blocked": "was blocked {:.0%} of the time (a read, a lock, a sleep: waiting, not "
                    "computing)",
         "running": "was on a core {:.0%} of the time (work these steps do and others do not)",
         "runnable": "waited for a core {:.0%} of the time"}
