"""Within a severity, the verdict's bottleneck's findings lead (doctor.rules.order): an
input-bound job's first fix is an input fix, even where a compute fix estimates more."""

from __future__ import annotations

from doctor.rules.order import bottleneck_first
from doctor.verdict import Finding


def finding(fid: str, category: str, severity: str = "warning") -> Finding:
    return Finding(id=fid, category=category, severity=severity, title=fid, evidence={})


def test_the_bottlenecks_findings_lead_within_each_severity() -> None:
    rules_order = [finding("killed", "other", "critical"), finding("ops.fp32_gemm", "compute"),
                   finding("input.preprocess", "preprocess"), finding("input.unsplit", "input"),
                   finding("steps.machine", "other"), finding("input.io", "io", "info"),
                   finding("optimizer.unfused", "compute", "info")]
    ids = [f.id for f in bottleneck_first(rules_order, "preprocess")]
    assert ids == ["killed", "input.preprocess", "input.unsplit", "ops.fp32_gemm",
                   "steps.machine", "input.io", "optimizer.unfused"]
    ids = [f.id for f in bottleneck_first(rules_order, "compute")]
    assert ids[:3] == ["killed", "ops.fp32_gemm", "input.preprocess"]
    assert [f.id for f in bottleneck_first(rules_order, None)] == [f.id for f in rules_order]


def test_a_straggler_leads_a_communication_bound_verdict() -> None:
    """The other ranks' all-reduce waits are the straggler's own work: its finding (category:
    what made it slow) leads where the verdict is communication."""
    rules_order = [finding("comm.exposed", "communication"),
                   finding("distributed.straggler", "preprocess"), finding("ops.x", "compute")]
    ids = [f.id for f in bottleneck_first(rules_order, "communication")]
    assert ids == ["comm.exposed", "distributed.straggler", "ops.x"]
