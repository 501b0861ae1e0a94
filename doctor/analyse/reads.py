"""How the job's bytes arrive: its processes' read calls, the bytes they returned and the bytes
read from storage, from the kernel's per-process io counters the parent samples
(``read_count``, ``read_chars``, ``read_bytes``: doctor.probes.host), never from the job.

Over the samples given (the analysed steps' span), each process's counters' growth is summed:
the mean read is the bytes returned per call (many small files, or small reads of a large one,
read a few KiB at a time), and the storage share is the bytes read from storage over the bytes
returned (near 0: the page cache served the reads; near 1: they waited on the device).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

KIB = 1024


@dataclass(frozen=True)
class ReadPattern:
    """The job's reads over ``seconds``."""

    reads: float  # read calls
    chars: float  # bytes the calls returned
    storage_bytes: float  # bytes read from storage
    seconds: float

    @property
    def mean_read_bytes(self) -> float:
        return self.chars / self.reads if self.reads > 0 else 0.0

    @property
    def reads_per_s(self) -> float:
        return self.reads / self.seconds if self.seconds > 0 else 0.0

    @property
    def storage_share(self) -> float:
        return min(1.0, self.storage_bytes / self.chars) if self.chars > 0 else 0.0

    @property
    def storage_mb_per_s(self) -> float:
        return self.storage_bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0

    def to_evidence(self) -> dict[str, float]:
        return {"reads_per_s": round(self.reads_per_s, 1),
                "mean_read_kib": round(self.mean_read_bytes / KIB, 2),
                "storage_share_of_read": round(self.storage_share, 3),
                "storage_mb_per_s": round(self.storage_mb_per_s, 2)}


def read_pattern(host: pd.DataFrame | None) -> ReadPattern | None:
    """The reads of the processes in ``host`` (None: no counters, or no read at all)."""
    if host is None or host.empty or not {"read_count", "read_chars"} <= set(host):
        return None
    keys = [c for c in ("node", "pid") if c in host]
    g = host.dropna(subset=["read_count", "read_chars"]).groupby(keys)
    if not len(g):
        return None
    grew = g[["read_count", "read_chars", "read_bytes"]].max() - \
        g[["read_count", "read_chars", "read_bytes"]].min()
    reads, chars = float(grew["read_count"].sum()), float(grew["read_chars"].sum())
    storage = float(np.nan_to_num(grew["read_bytes"].to_numpy(np.float64)).sum())
    span = float(host["t_s"].max() - host["t_s"].min())
    if reads <= 0 or span <= 0:
        return None
    return ReadPattern(reads, chars, storage, span)
