"""Host allocator rules: large tensors that pay page faults on every step (CPU jobs).

glibc's malloc serves a request above its mmap threshold with a fresh ``mmap`` and hands it back
with ``munmap`` on free, so a tensor of that size costs a page fault per 4 KiB page each time it
is made; the threshold rises on its own (to the size of a freed mapped block, up to 32 MiB, and
the trim threshold to twice that), but a job whose large tensors never move it far enough pays
those faults on every step. The profiler window's own allocations move it further: the steps
after the window are then faster than the steps before it (doctor.analyse.window_drift), which is
the evidence here, and the speed-up a fixed threshold gives the bare job. ``doctor try`` measures
it: the fix is two environment variables.
"""

from __future__ import annotations

from doctor.analyse.evidence import Evidence
from doctor.rules.base import rule
from doctor.verdict import Finding, Fix

#: What the window leaves behind: glibc's largest dynamic mmap threshold, and twice that as the
#: trim threshold (bytes).
MMAP_THRESHOLD = 32 * 1024 * 1024
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD
ENV = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD),
       "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD)}


#: Page faults a step after the window from which the job is said to pay them every step
#: (4 MiB of fresh pages a step), and what one costs (the kernel's fault and zeroing of a 4 KiB
#: page; a floor: a busy machine pays more).
STEADY_FAULTS = 1024
FAULT_S = 0.25e-6


@rule("allocator.page_faults", needs=("window_drift",))
def page_faults(ev: Evidence) -> list[Finding]:
    """On a CPU job: the steps after the window are faster than those before it and the page
    faults (where measured) say it is the allocator; or, the window aside, the job still pays
    many page faults a step after it."""
    if ev.job.device != "cpu" or ev.window_drift is None:
        return []
    faster = [d for d in ev.window_drift if d.faster and d.allocator is not False]
    if faster:
        d = min(faster, key=lambda x: x.ratio)
        likely = "" if d.allocator else "likely "
        title = (f"Steps ran {1 - d.ratio:.0%} faster after the profiler window than before it: "
                 f"large tensors {likely}pay page faults on every step (glibc's mmap threshold)")
        why = (f"the steps after the window ran {d.after_s * 1e3:.1f} ms against "
               f"{d.before_s * 1e3:.1f} ms before it"
               + (f", with {d.faults_after:.0f} page faults a step against "
                  f"{d.faults_before:.0f}" if d.faults_before is not None else ""))
        return [_finding(title, why, 1 / d.ratio, {**d.to_dict(),
                                                   "ranks": [x.rank for x in faster]})]
    steady = [d for d in ev.window_drift
              if d.faults_after is not None and d.faults_after >= STEADY_FAULTS]
    if not steady:
        return []
    d = max(steady, key=lambda x: (x.faults_after or 0) / x.after_s)
    faults = d.faults_after or 0.0
    cost = min(faults * FAULT_S, d.after_s * 0.5)
    title = (f"Each step pays {faults:.0f} page faults ({faults * 4 / 1024:.0f} MiB of fresh "
             "pages): glibc maps and unmaps the job's large tensors every step")
    why = (f"{faults:.0f} minor page faults a step after the profiler window, at least "
           f"{cost * 1e3:.1f} ms of a {d.after_s * 1e3:.1f} ms step")
    return [_finding(title, why, d.after_s / (d.after_s - cost),
                     {**d.to_dict(), "fault_cost_floor_s": cost,
                      "ranks": [x.rank for x in steady]})]


def _finding(title: str, why: str, speedup: float, evidence: dict[str, object]) -> Finding:
    env = " ".join(f"{k}={v}" for k, v in ENV.items())
    return Finding(
        id="allocator.page_faults", category="compute", severity="info", title=title,
        evidence=evidence,
        fixes=(Fix(
            title="Keep large tensors' memory in the heap (glibc malloc thresholds)",
            why=(why + ": glibc maps and unmaps each large tensor, a page fault per 4 KiB every "
                 "step, until a large free raises its threshold. Fixed thresholds keep that "
                 "memory for reuse (more resident memory: up to the trim threshold above the "
                 "job's peak). jemalloc or tcmalloc (LD_PRELOAD=libjemalloc.so.2) do the same "
                 "without the variables"),
            code=f"{env} python train.py ...",
            apply={"env": dict(ENV)},
            estimated_speedup=speedup,
        ),),
        estimated_speedup=speedup,
    )
