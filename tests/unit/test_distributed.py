"""Distributed runs on recorded per-rank data (fake clock, no job): the merge of several run
directories, the per-rank table, and the straggler rule. Proportions and categories only.

Each rank's loop is recorded through a real Session (tests/support.py); its profiler window is a
small recorded Kineto trace in the same shape as a gloo DDP step: the DataLoader wait, the rank's
own ops on the main thread, and ``gloo:all_reduce`` on gloo's own thread, exposed where the main
thread has nothing else to do (waiting at the end of backward).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from doctor.analyse.distributed import HOST_CONTENTION, Straggler, rank_table, search_stragglers
from doctor.analyse.evidence import Evidence
from doctor.pipeline import analyze_run
from doctor.record.session import Session
from doctor.reports.html import render_html
from doctor.rules.distributed import straggler
from doctor.verdict import CATEGORIES
from tests.support import FakeClock, write_record


def find_stragglers(ledger: pd.DataFrame, host: pd.DataFrame | None = None,
                    rank_pids: dict[int, int] | None = None) -> list[Straggler]:
    return search_stragglers(ledger, host, rank_pids).stragglers

STEPS = 40


def ddp_trace(wait_s: float, compute_s: float, comm_s: float, hidden_s: float = 0.0,
              steps: int = 5) -> dict[str, Any]:
    """A CPU trace of ``steps`` DDP steps: input wait, the rank's own ops, then the all-reduce
    on gloo's thread (its first ``hidden_s`` overlapped by the end of backward)."""
    events: list[dict[str, Any]] = []
    us = 1e6
    step = (wait_s + compute_s + comm_s - hidden_s) * us
    for i in range(steps):
        t = i * step
        events.append(_ev("user_annotation", f"ProfilerStep#{i + 1}", t, step))
        if wait_s:
            events.append(_ev("user_annotation",
                              "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                              t, wait_s * us))
        events.append(_ev("cpu_op", "aten::mm", t + wait_s * us, compute_s * us))
        start = t + (wait_s + compute_s - hidden_s) * us
        events.append(_ev("cpu_op", "c10d::allreduce_", start, 1.0))
        events.append(_ev("user_annotation", "gloo:all_reduce", start, comm_s * us, tid=9))
    return {"traceEvents": events}


def _ev(cat: str, name: str, ts: float, dur: float, tid: int = 1) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


def record_rank(run_dir: Path, rank: int, *, wait_s: float = 0.0, compute_s: float = 0.01,
                comm_s: float = 0.0, hidden_s: float = 0.0, steps: int = STEPS,
                clock_s: float = 1000.0) -> Path:
    """One rank of a DDP job through a real Session on a fake clock (``clock_s``: where its
    node's monotonic clock starts): its ring buffers, then its profiler window. As in DDP, the
    wait for the all-reduce is inside backward() (it completes at the end of backward)."""
    clock = FakeClock(round(clock_s * 1e9))
    session = Session(run_dir, rank=rank, clock=clock, window_start=10**9)
    loader = session.record_loader({"num_workers": 0, "batch_size": 32, "pin_memory": False,
                                    "persistent_workers": False})
    for _ in range(steps):
        t0 = clock()
        clock.tick(wait_s)
        session.record_interval("loader_wait", t0, clock(), loader)
        clock.tick(compute_s * 0.4)  # forward
        b0 = clock()
        clock.tick(compute_s * 0.5 + comm_s - hidden_s)  # backward, then the exposed all-reduce
        session.record_interval("backward", b0, clock())
        session.record_optimizer_start()
        clock.tick(compute_s * 0.1)
        session.record_optimizer_end(0)
    session.close()
    proc_dir = session.directory
    (proc_dir / "trace.json").write_text(json.dumps(ddp_trace(wait_s, compute_s, comm_s,
                                                              hidden_s)))
    return proc_dir


def slow_input_job(run_dir: Path) -> None:
    """Rank 1 waits 30 ms a step for its input; rank 0 waits for rank 1 in the all-reduce."""
    record_rank(run_dir, 0, compute_s=0.010, comm_s=0.032)
    record_rank(run_dir, 1, wait_s=0.030, compute_s=0.010, comm_s=0.002)
    write_record(run_dir)


def finding(verdict: Any, rule_id: str) -> Any:
    hits = [f for f in verdict.findings if f.id == rule_id]
    assert hits, [f.id for f in verdict.findings]
    return hits[0]


def test_slow_input_rank_is_named_with_its_cause_and_the_rank_that_waits(tmp_path: Path) -> None:
    slow_input_job(tmp_path)
    analysis = analyze_run(tmp_path)
    verdict = analysis.verdict
    assert verdict.job["ranks"] == 2
    assert verdict.bottleneck == "communication"  # rank 0 waiting counts as communication
    s = finding(verdict, "distributed.straggler")
    assert s.evidence["slow_rank"] == 1
    assert s.evidence["likely_cause"] == "input"
    assert s.evidence["cause_category"] in ("preprocess", "input")  # input: wait not split
    assert s.evidence["waiting_ranks"] == [0]
    assert 0.6 < s.evidence["extra_share_of_step"] < 0.8  # 30 of 42 ms
    assert s.evidence["slower_in_fraction_of_steps"] == 1.0
    assert s.severity == "critical"
    assert s.category == s.evidence["cause_category"]
    assert "Rank 1" in s.title and "rank 0" in s.title
    assert "DistributedSampler" in " ".join(f.code for f in s.fixes)
    assert s.estimated_speedup > 2
    assert verdict.findings.index(s) < 2
    # rank 0's wait is the straggler's, not exposed communication as well
    assert "comm.exposed" not in [f.id for f in verdict.findings]


def test_rank_table_has_shares_and_the_hidden_part_of_the_all_reduce(tmp_path: Path) -> None:
    record_rank(tmp_path, 0, compute_s=0.02, comm_s=0.02, hidden_s=0.015)
    record_rank(tmp_path, 1, compute_s=0.02, comm_s=0.02, hidden_s=0.005)
    write_record(tmp_path)
    analysis = analyze_run(tmp_path)
    table = analysis.tables.ranks.set_index("rank")
    assert list(table.index) == [0, 1]
    shares = table[[c for c in table if c.endswith("_share")]].sum(axis=1)
    assert np.allclose(shares, 1.0)
    assert table.loc[0, "window_comm_hidden_fraction"] == pytest.approx(0.75, abs=0.02)
    assert table.loc[1, "window_comm_hidden_fraction"] == pytest.approx(0.25, abs=0.02)
    assert table.loc[1, "communication_share"] > table.loc[0, "communication_share"]
    assert "distributed.straggler" not in [f.id for f in analysis.verdict.findings]
    html = render_html(analysis)
    assert "Per rank" in html and "window_comm_hidden_fraction" in html


def test_balanced_ranks_have_no_straggler(tmp_path: Path) -> None:
    for rank in range(4):
        record_rank(tmp_path, rank, wait_s=0.002, compute_s=0.02 + 0.0005 * rank, comm_s=0.01)
    write_record(tmp_path)
    verdict = analyze_run(tmp_path).verdict
    assert verdict.job["ranks"] == 4
    assert "distributed.straggler" not in [f.id for f in verdict.findings]


def test_two_run_directories_merge_into_one_job(tmp_path: Path) -> None:
    """Two nodes, each with its own ``doctor run`` directory and clock: ranks 0-1 and 2-3."""
    node_a, node_b = tmp_path / "node-a", tmp_path / "node-b"
    record_rank(node_a, 0, compute_s=0.02, comm_s=0.025)
    record_rank(node_a, 1, compute_s=0.02, comm_s=0.025)
    record_rank(node_b, 2, compute_s=0.02, comm_s=0.025, clock_s=5000.0)
    record_rank(node_b, 3, compute_s=0.04, comm_s=0.005, clock_s=5000.0)  # 20 ms more a step
    write_record(node_a)
    write_record(node_b, t0_monotonic_s=5000.0, host="node-b")
    analysis = analyze_run([node_a, node_b])
    verdict = analysis.verdict
    assert verdict.job["ranks"] == 4
    assert sorted(analysis.ledger["rank"].unique()) == [0, 1, 2, 3]
    assert len(analysis.tables.ranks) == 4
    assert analysis.ledger["start_s"].min() >= 0  # each node's steps from its own origin
    s = finding(verdict, "distributed.straggler")
    assert s.evidence["slow_rank"] == 3
    assert s.evidence["likely_cause"] == "compute"
    assert s.evidence["waiting_ranks"] == [0, 1, 2]
    assert "Balance the work" in s.fixes[0].title
    assert analysis.source.count("node-") == 2
    from doctor.analyse.stages import job_facts
    from doctor.analyse.steps import training_processes
    from doctor.store.reader import load_run

    run = load_run([node_a, node_b])
    job = job_facts(run, training_processes(run), run.window)
    assert (job.ranks, job.ranks_here) == (4, 2)  # two ranks share each node's cores


def test_a_rank_that_crashed_is_named_and_the_report_is_partial(tmp_path: Path) -> None:
    record_rank(tmp_path, 0, compute_s=0.01, comm_s=0.01)
    crashed = record_rank(tmp_path, 1, compute_s=0.01, comm_s=0.01, steps=25)
    meta = json.loads((crashed / "meta.json").read_text())
    meta["crashed"] = "RuntimeError: rank 1 failed on purpose at step 25"
    (crashed / "meta.json").write_text(json.dumps(meta))
    write_record(tmp_path, exit_code=1)
    analysis = analyze_run(tmp_path)
    assert analysis.verdict.partial
    assert any(n.startswith("Rank 1 failed: RuntimeError") for n in analysis.verdict.notes)
    assert "Rank 1 failed" in render_html(analysis)


# ----- the straggler analysis on hand-made ledgers -----------------------------------------


def ledger_of(per_rank: dict[int, dict[str, float]], steps: int = 30,
              jitter: float = 0.0) -> pd.DataFrame:
    """A ledger with ``steps`` identical steps per rank (plus seeded jitter on compute)."""
    rng = np.random.default_rng(0)
    rows = []
    for rank, parts in per_rank.items():
        for step in range(1, steps + 1):
            row = dict.fromkeys(CATEGORIES, 0.0)
            row.update(parts)
            row["compute"] += float(rng.uniform(0, jitter))
            row.update(rank=rank, step=step, start_s=step * 0.1,
                       wall_s=sum(row[c] for c in CATEGORIES), analyzed=True)
            rows.append(row)
    return pd.DataFrame(rows)


def test_compute_that_cpu_time_does_not_explain_is_host_contention() -> None:
    ledger = ledger_of({0: {"compute": 0.02, "communication": 0.02},
                        1: {"compute": 0.04, "communication": 0.0}})
    t = np.arange(0.0, 4.0, 0.5)
    host = pd.DataFrame({"pid": np.repeat([100, 101], len(t)), "t_s": np.tile(t, 2),
                         "cpu_s": np.concatenate([t * 0.5, t * 0.5])})  # same CPU use each
    found = find_stragglers(ledger, host, {0: 100, 1: 101})
    assert [s.rank for s in found] == [1]
    assert found[0].cause == HOST_CONTENTION
    f = straggler(Evidence(ledger=ledger, host=host,
                           stragglers=search_stragglers(ledger, host, {0: 100, 1: 101})))[0]
    assert f.evidence["likely_cause"] == HOST_CONTENTION
    assert "cores of its own" in f.fixes[0].title
    # the same excess backed by the CPU time it costs is plain compute
    busy = host.assign(cpu_s=np.concatenate([t * 0.5, t * 1.0]))
    assert find_stragglers(ledger, busy, {0: 100, 1: 101})[0].cause == "compute"


def test_several_slow_ranks_but_never_more_than_half() -> None:
    fast = {"compute": 0.02, "communication": 0.03}
    slow = {"compute": 0.05, "communication": 0.0}
    ledger = ledger_of({r: slow if r in (2, 5) else fast for r in range(8)}, jitter=0.002)
    found = find_stragglers(ledger)
    assert sorted(s.rank for s in found) == [2, 5]
    assert all(sorted(s.waiting) == [0, 1, 3, 4, 6, 7] for s in found)
    # two ranks that differ: one of them is "the straggler", never both
    two = ledger_of({0: slow, 1: fast})
    assert [s.rank for s in find_stragglers(two)] == [0]


def test_small_or_inconsistent_differences_are_not_stragglers() -> None:
    ledger = ledger_of({0: {"compute": 0.020, "communication": 0.002},
                        1: {"compute": 0.021, "communication": 0.001}})
    assert find_stragglers(ledger) == []
    # a rank slower in only some steps (alternating) is noise, not a straggler
    rows = ledger_of({0: {"compute": 0.02}, 1: {"compute": 0.02}})
    odd = (rows["rank"] == 1) & (rows["step"] % 2 == 1)
    rows.loc[odd, "compute"] += 0.02
    rows.loc[odd, "wall_s"] += 0.02
    assert find_stragglers(rows) == []
    assert find_stragglers(ledger_of({0: {"compute": 0.02}})) == []
    assert rank_table(ledger_of({0: {"compute": 0.02}})).empty


# ----- scale: a budget, not a benchmark ------------------------------------------------------


