"""What each rank's collectives moved, how fast, and why the exposed ones were slow.

From the collectives of each rank's profiler window (doctor.trace.comm_calls), per rank and kind
of collective: calls, bytes, time, the part no compute overlapped (exposed), and the median bus
bandwidth. Each exposed collective is classed:

- ``waiting``: it started well before the last rank started the same collective (the same kind,
  the same ordinal on every rank), so most of its time went to waiting for the others; the slow
  rank is the cause, not the link;
- ``latency``: its message is too small for the link's bandwidth to matter (under
  ``LATENCY_BYTES``): many small collectives cost a round trip each;
- ``bandwidth``: otherwise, moving its bytes at the bus bandwidth shown;
- ``unknown``: not waiting, and the trace does not say its size.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from doctor.analyse.steps import RankSteps
from doctor.store.rundata import RunData

#: Below this a message's transfer time is small against a collective's round trips (NCCL's
#: low-latency protocol is used up to about this size; gloo's TCP rounds cost more).
LATENCY_BYTES = 256 * 1024
#: A collective that started this share of its time before the last rank's is waiting.
WAITING_SHARE = 0.5
WAITING, LATENCY, BANDWIDTH = "waiting", "latency", "bandwidth"
UNKNOWN = "unknown"  # neither waiting nor of a known size
SHOWN = ("rank", "kind", "calls", "bytes", "time_s", "exposed_s", "bus_gb_per_s", "waiting_s",
         "bound")


@dataclass(frozen=True)
class RankComms:
    rank: int
    calls: pd.DataFrame  # one row per collective, with waiting_s and bound
    window_s: float  # the profiled steps' time, for per-step figures

    def by_kind(self) -> pd.DataFrame:
        """Per kind of collective: calls, bytes, time, exposed, median bus bandwidth (GB/s), time
        waiting, and the class with the most exposed time."""
        c = self.calls
        if c.empty:
            return pd.DataFrame(columns=list(SHOWN))
        g = c.groupby("kind", sort=False)
        out = pd.DataFrame({
            "calls": g.size(), "bytes": g["bytes"].sum(min_count=1),
            "time_s": g["seconds"].sum(), "exposed_s": g["exposed_s"].sum(),
            "bus_gb_per_s": g["bus_bytes_s"].median() / 1e9, "waiting_s": g["waiting_s"].sum(),
        }).reset_index()
        out["bound"] = [_main_bound(c[c["kind"] == k]) for k in out["kind"]]
        out.insert(0, "rank", self.rank)
        return out.sort_values("exposed_s", ascending=False).reset_index(drop=True)

    def exposed_by_bound(self) -> dict[str, float]:
        c = self.calls
        return {str(k): float(v) for k, v in c.groupby("bound")["exposed_s"].sum().items()}

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "window_s": self.window_s,
                "exposed_by_bound_s": self.exposed_by_bound(),
                "by_kind": self.by_kind().to_dict(orient="records")}


def _main_bound(calls: pd.DataFrame) -> str:
    by = calls.groupby("bound")["exposed_s"].sum()
    return str(by.idxmax()) if len(by) and float(by.max()) > 0 else ""


def waiting_times(calls: pd.DataFrame) -> pd.Series:
    """Per collective (index of ``calls``, rows of every rank), how long it waited for the last
    rank to start the same collective: the same kind and ordinal on each rank, matched only
    where every rank has the same count of that kind."""
    out = pd.Series(0.0, index=calls.index)
    if calls.empty or calls["rank"].nunique() < 2:
        return out
    for _kind, same in calls.groupby("kind"):
        counts = same.groupby("rank").size()
        if counts.nunique() != 1:
            continue  # the ranks' windows hold different collectives: no match by ordinal
        ordinal = same.sort_values("start_us").groupby("rank").cumcount()
        last = same["start_us"].groupby(ordinal).transform("max")
        out.loc[same.index] = np.minimum((last - same["start_us"]) * 1e-6, same["seconds"])
    return out


def classify(calls: pd.DataFrame, waited: pd.Series) -> pd.DataFrame:
    out = calls.assign(waiting_s=waited)
    small = out["bytes"].notna() & (out["bytes"] < LATENCY_BYTES)
    waiting = out["waiting_s"] >= WAITING_SHARE * out["seconds"]
    known = out["bytes"].notna()
    out["bound"] = np.where(waiting, WAITING, np.where(
        small, LATENCY, np.where(known, BANDWIDTH, UNKNOWN)))
    return out


def comms_evidence(run: RunData, ranks: Mapping[int, RankSteps], window: pd.DataFrame
                   ) -> dict[int, RankComms]:
    """Every rank's collectives (see the module docstring); ranks without any are left out."""
    frame = run.collectives
    if frame.empty:
        return {}
    mains = {(m.node, m.pid): rank for rank, m in ranks.items()}
    keep = [(int(n), int(p)) in mains for n, p in zip(frame["node"], frame["pid"], strict=True)]
    calls = frame[keep].copy()
    if calls.empty:
        return {}
    calls["rank"] = [mains[(int(n), int(p))] for n, p in
                     zip(calls["node"], calls["pid"], strict=True)]
    calls = classify(calls, waiting_times(calls))
    out = {}
    for rank in sorted(set(calls["rank"])):
        mine = calls[calls["rank"] == rank]
        steps = window[window["rank"] == rank] if "rank" in window else window
        window_s = float(steps["dur_s"].sum()) if "dur_s" in steps and len(steps) else 0.0
        out[rank] = RankComms(rank, mine.reset_index(drop=True), window_s)
    return out


def comms_table(comms: Mapping[int, RankComms]) -> dict[str, pd.DataFrame]:
    """The report's table (none without collectives): every rank's collectives by kind."""
    parts = [c.by_kind() for _, c in sorted(comms.items())]
    return {"communication": pd.concat(parts, ignore_index=True)} if parts else {}
