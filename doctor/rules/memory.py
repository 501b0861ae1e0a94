"""Memory rules over the CUDA allocator's snapshots: fragmentation, said only where it is
measured (split blocks the allocator cannot reuse, a sizeable share of what it reserved). An
out-of-memory error or allocation retries without them are memory pressure, not fragmentation:
memory.near_limit says what frees memory then (doctor.rules.memory_fit)."""

from __future__ import annotations

import numpy as np

from doctor.analyse.evidence import Evidence
from doctor.rules.base import RuleSkipped, rule
from doctor.verdict import Finding, Fix

MIB = 1 << 20
MIN_SPLIT_BYTES = 256 * MIB
MIN_SPLIT_SHARE = 0.1  # of the peak reserved


@rule("memory.fragmentation", needs=("memory",))
def fragmentation(ev: Evidence) -> list[Finding]:
    m = ev.memory
    assert m is not None  # guaranteed by needs
    cols = ("allocated_bytes", "reserved_bytes", "inactive_split_bytes")
    missing = [c for c in cols if c not in m]
    if missing:
        raise RuleSkipped(f"memory snapshots lack {', '.join(missing)}")
    reserved = np.nan_to_num(m["reserved_bytes"].to_numpy(dtype="float64"))
    allocated = np.nan_to_num(m["allocated_bytes"].to_numpy(dtype="float64"))
    split = float(np.nan_to_num(m["inactive_split_bytes"].to_numpy(dtype="float64")).max())
    retries = int(np.nan_to_num(m["alloc_retries"].to_numpy(dtype="float64")).max()) if (
        "alloc_retries" in m) else 0
    ooms = int(np.nan_to_num(m["num_ooms"].to_numpy(dtype="float64")).max()) if (
        "num_ooms" in m) else 0
    peak = int(np.argmax(reserved))
    peak_reserved = float(reserved[peak])
    slack = float((reserved - allocated).max())
    frag_share = split / peak_reserved if peak_reserved > 0 else 0.0
    if not (split >= MIN_SPLIT_BYTES and frag_share >= MIN_SPLIT_SHARE):
        return []
    severity = "critical" if ooms > 0 else "warning" if retries > 0 or frag_share >= 0.2 else "info"
    return [Finding(
        id="memory.fragmentation", category="compute", severity=severity,
        title=(
            f"The CUDA caching allocator holds {split / MIB:.0f} MiB in split blocks it cannot "
            f"reuse ({frag_share:.0%} of reserved)"
            + (f"; {retries} allocation retries" if retries else "")
            + (f"; {ooms} out-of-memory errors" if ooms else "")
        ),
        evidence={
            "peak_reserved_bytes": int(peak_reserved),
            "allocated_at_peak_bytes": int(allocated[peak]),
            "inactive_split_bytes": int(split),
            "reserved_minus_allocated_bytes": int(slack),
            "would_free_bytes": int(split),
            "fragmented_share_of_reserved": frag_share,
            "alloc_retries": retries,
            "num_ooms": ooms,
        },
        fixes=(
            Fix(
                title="Expandable segments",
                why=(
                    f"segments that grow in place leave no split blocks: about {split / MIB:.0f} "
                    "MiB back, and no cache flushes on retries; set it before CUDA starts "
                    "(or in the shell: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)"
                ),
                code=(
                    "import os\n"
                    "os.environ[\"PYTORCH_CUDA_ALLOC_CONF\"] = \"expandable_segments:True\"\n"
                    "import torch  # after setting it: the allocator reads it once"
                ),
                apply={"env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}},
            ),
        ),
        estimated_speedup=None,
    )]
