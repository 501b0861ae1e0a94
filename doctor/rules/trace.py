"""Traces analysed on their own: what a trace recorded elsewhere did not capture."""

from __future__ import annotations

from doctor.analyse.evidence import Evidence
from doctor.rules.base import rule
from doctor.verdict import Finding, Fix


@rule("trace.cpu_only", needs=("window", "traces"))
def cpu_only(ev: Evidence) -> list[Finding]:
    """A trace with no GPU activity: analysed as a CPU job, which it may not have been."""
    window = ev.window
    assert window is not None
    if (window["device"] == "cuda").any():
        return []
    return [Finding(
        id="trace.cpu_only", category="compute", severity="info",
        title="No GPU activity in the trace: analysed as a CPU job",
        evidence={"gpu_events": 0, "profiled_steps": len(window)},
        fixes=(Fix(
            title="Record the GPU too",
            why="kernels, copies and collectives only appear with the CUDA activity on",
            code="activities = [torch.profiler.ProfilerActivity.CPU, "
                 "torch.profiler.ProfilerActivity.CUDA]",
        ),),
    )]
