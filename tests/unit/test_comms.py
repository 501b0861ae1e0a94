"""Each rank's collectives classed (doctor.analyse.comms): waiting for a late rank, latency-bound
small messages, bandwidth-bound large ones; and a two-rank trace merge."""

from __future__ import annotations

import pandas as pd
import pytest

from doctor.analyse.comms import (
    BANDWIDTH,
    LATENCY,
    UNKNOWN,
    WAITING,
    RankComms,
    classify,
    waiting_times,
)
from tests.support import SHARED_TRACES


def calls(rows: list[tuple[int, str, float, float, float | None]]) -> pd.DataFrame:
    """(rank, kind, start us, seconds, bytes) rows."""
    return pd.DataFrame([{"rank": r, "kind": k, "start_us": s, "seconds": d,
                          "exposed_s": d, "bytes": b, "bus_bytes_s": float("nan")}
                         for r, k, s, d, b in rows])


def test_a_rank_that_started_early_waits_for_the_last_one() -> None:
    c = calls([
        (0, "allreduce", 0, 0.010, 64e6), (1, "allreduce", 8000, 0.002, 64e6),  # rank 1 late
        (0, "allreduce", 20000, 0.002, 64e6), (1, "allreduce", 20000, 0.002, 64e6),
    ])
    waited = waiting_times(c)
    assert waited.tolist() == pytest.approx([0.008, 0.0, 0.0, 0.0])
    bound = classify(c, waited)["bound"].tolist()
    assert bound == [WAITING, BANDWIDTH, BANDWIDTH, BANDWIDTH]


def test_small_messages_are_latency_bound_and_unknown_sizes_said_so() -> None:
    c = calls([(0, "allreduce", 0, 1e-3, 4096), (0, "allgather", 10, 1e-3, None),
               (0, "allreduce", 20, 5e-3, 32e6)])
    out = classify(c, waiting_times(c))
    assert out["bound"].tolist() == [LATENCY, UNKNOWN, BANDWIDTH]
    by = RankComms(0, out, 1.0).by_kind().set_index("kind")
    assert by.loc["allreduce", "calls"] == 2 and by.loc["allreduce", "bytes"] == 4096 + 32e6
    assert by.loc["allreduce", "bound"] == BANDWIDTH  # the most exposed time
    assert pd.isna(by.loc["allgather", "bytes"])


def test_ranks_with_different_collectives_are_not_matched() -> None:
    c = calls([(0, "allreduce", 0, 0.01, 1e6), (1, "allreduce", 5000, 0.01, 1e6),
               (1, "allreduce", 9000, 0.01, 1e6)])
    assert waiting_times(c).tolist() == [0.0, 0.0, 0.0]


def test_two_sampled_ranks_of_a_recsys_job() -> None:
    from doctor.pipeline import analyze_traces
    from doctor.reports.json import verdict_data

    paths = [SHARED_TRACES / "recsys_128_ranks_sampled" / f"rank-{r}.json.gz" for r in (0, 1)]
    if not all(p.is_file() for p in paths):
        pytest.skip("the recsys traces are not here (../shared/traces)")
    analysis = analyze_traces(paths)
    table = analysis.tables.communication
    assert table is not None
    assert set(table["rank"]) == {0, 1}
    assert set(table["kind"]) == {"alltoall", "allgather", "allreduce"}
    ranks = {r["rank"]: r for r in verdict_data(analysis)["communication"]}
    # the two ranks' all-to-alls are matched by order, and one waits on the other
    waiting = [sum(k["waiting_s"] for k in ranks[r]["by_kind"]) for r in (0, 1)]
    assert max(waiting) > 0
