"""Distributed runs on recorded per-rank data (fake clock, no job): the merge of several run
directories, the per-rank table, and the straggler rule. Proportions and categories only.

Each rank's loop is recorded through a real Session (tests/support.py); its profiler window is a
small recorded Kineto trace in the same shape as a gloo DDP step: the DataLoader wait, the rank's
own ops on the main thread, and ``gloo:all_reduce`` on gloo's own thread, exposed where the main
thread has nothing else to do (waiting at the end of backward).

The tests here start jobs, processes or real clocks (tests/e2e); the pure ones are in
tests/unit/test_distributed.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT, FakeClock, record_loop, write_record


def write_synthetic_run(run_dir: Path, ranks: int, steps: int, slow_rank: int = -1) -> None:
    """A run directory of ``ranks`` x ``steps`` written through real Sessions (fake clock)."""
    for rank in range(ranks):
        slow = rank == slow_rank % ranks
        record_loop(run_dir, steps, wait_s=0.004 if slow else 0.001, compute_s=0.02,
                    rank=rank, clock=FakeClock())
    write_record(run_dir, cores=64)


MEASURE = """
import json, resource, sys, time
from pathlib import Path
from doctor.pipeline import analyze_run
from doctor.reports.html import render_html
t0 = time.perf_counter()
analysis = analyze_run(Path(sys.argv[1]))
html = render_html(analysis)
elapsed = time.perf_counter() - t0
straggler = [f.evidence for f in analysis.verdict.findings if f.id == "distributed.straggler"]
print(json.dumps({"elapsed_s": elapsed, "max_rss_kb": resource.getrusage(
    resource.RUSAGE_SELF).ru_maxrss, "ranks": analysis.verdict.job["ranks"],
    "rows": len(analysis.ledger), "table_rows": len(analysis.tables.ranks),
    "slow_rank": straggler[0]["slow_rank"] if straggler else None, "html_chars": len(html)}))
"""


def test_budget_64_ranks_x_1000_steps_merge_and_report_under_10_s(tmp_path: Path) -> None:
    """Budget: 64 ranks x 1,000 steps analyse and render in under 10 s with under 1 GiB peak
    memory, in a fresh process (generous on purpose: a tripwire for accidental quadratic work
    or unbounded reads, not a timing claim; bench/merge_scale.py prints the real figures)."""
    write_synthetic_run(tmp_path, 64, 1000, slow_rank=17)
    out = subprocess.run([sys.executable, "-c", MEASURE, str(tmp_path)], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["elapsed_s"] < 10.0, got
    assert got["max_rss_kb"] < 1 << 20, got
    assert (got["ranks"], got["rows"], got["table_rows"]) == (64, 64 * 999, 64)
    assert got["slow_rank"] == 17
