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

from doctor.rules.base import rule
from doctor.rules.evidence import Evidence
from doctor.verdict import Finding, Fix

#: What the window leaves behind: glibc's largest dynamic mmap threshold, and twice that as the
#: trim threshold (bytes).
MMAP_THRESHOLD = 32 * 1024 * 1024
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD
ENV = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD),
       "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD)}


@rule("allocator.page_faults", needs=("window_drift",))
def page_faults(ev: Evidence) -> list[Finding]:
    """The steps after the window are faster than those before it, on a CPU job."""
    if ev.job.device != "cpu" or ev.window_drift is None:
        return []
    # faster after the window, and the page faults (where measured) say it is the allocator
    faster = [d for d in ev.window_drift if d.faster and d.allocator is not False]
    if not faster:
        return []
    d = min(faster, key=lambda x: x.ratio)
    speedup = 1 / d.ratio
    env = " ".join(f"{k}={v}" for k, v in ENV.items())
    likely = "" if d.allocator else "likely "
    return [Finding(
        id="allocator.page_faults", category="compute", severity="info",
        title=(f"Steps ran {1 - d.ratio:.0%} faster after the profiler window than before it: "
               f"large tensors {likely}pay page faults on every step (glibc's mmap threshold)"),
        evidence={**d.to_dict(), "ranks": [x.rank for x in faster]},
        fixes=(Fix(
            title="Keep large tensors' memory in the heap (glibc malloc thresholds)",
            why=(f"the steps after the window ran {d.after_s * 1e3:.1f} ms against "
                 f"{d.before_s * 1e3:.1f} ms before it"
                 + (f", with {d.faults_after:.0f} page faults a step against "
                    f"{d.faults_before:.0f}" if d.faults_before is not None else "")
                 + ": glibc maps and unmaps each large tensor, "
                 "a page fault per 4 KiB every step, until a large free raises its threshold. "
                 "Fixed thresholds keep that memory for reuse (more resident memory: up to the "
                 "trim threshold above the job's peak). jemalloc or tcmalloc "
                 "(LD_PRELOAD=libjemalloc.so.2) do the same without the variables"),
            code=f"{env} python train.py ...",
            apply={"env": dict(ENV)},
            estimated_speedup=speedup,
        ),),
        estimated_speedup=speedup,
    )]
