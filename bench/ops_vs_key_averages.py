"""doctor's ops table next to torch.profiler's own ``key_averages()`` for the same steps.

Each sample job runs whole, in this process, under one torch.profiler (shapes recorded, as
doctor's window does); the trace it exports goes through ``doctor.trace.ops.op_table`` and the
profiler's ``key_averages()`` gives its own table. The two top-N lists by own (self) CPU time
are printed side by side (``key_averages()``'s annotations, ``ProfilerStep#N`` and
``Optimizer.step#...``, left out: they are ranges, not ops), with whether they hold the same
ops in the same order.

    python bench/ops_vs_key_averages.py [--top 10] [--steps 30]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import runpy
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from torch.profiler import ProfilerActivity, profile

from doctor.trace.events import load_timeline
from doctor.trace.ops import op_table

ROOT = Path(__file__).resolve().parents[1]
#: each sample job, with its extra arguments
JOBS: dict[str, list[str]] = {"compute_bound": [], "elementwise_bound": []}


def compare(job: str, extra: list[str], top: int, steps: int) -> bool:
    script = ROOT / "sample_jobs" / f"{job}.py"
    argv = sys.argv
    sys.argv = [str(script), "--steps", str(steps), *extra]
    try:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof, \
                contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = argv
    name = f"sample_jobs/{job}.py --steps {steps} {' '.join(extra)}".strip()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        ours = op_table(load_timeline(path))
    theirs = sorted(((e.key, e.self_cpu_time_total * 1e-6) for e in prof.key_averages()),
                    key=lambda kv: -kv[1])
    ours_top = list(zip(ours["op"].head(top), ours["self_s"].head(top), strict=True))
    # annotations (ProfilerStep#N, Optimizer.step#SGD.step) are ranges, not ops: left out
    theirs_top = [kv for kv in theirs if "#" not in kv[0]][:top]
    print(f"\n== {name}: top {top} ops by own CPU time ==")
    print(f"{'doctor op':42s} {'self ms':>8s}   {'key_averages op':42s} {'self ms':>8s}")
    for (a, sa), (b, sb) in zip(ours_top, theirs_top, strict=False):
        mark = "" if a == b else "  <- differs"
        print(f"{a[:42]:42s} {sa * 1e3:8.2f}   {b[:42]:42s} {sb * 1e3:8.2f}{mark}")
    same_order = [a for a, _ in ours_top] == [b for b, _ in theirs_top]
    same_set = {a for a, _ in ours_top} == {b for b, _ in theirs_top}
    print(f"same ops: {'yes' if same_set else 'no'}; same order: {'yes' if same_order else 'no'}")
    return same_order


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    for job, extra in JOBS.items():
        compare(job, extra, args.top, args.steps)


if __name__ == "__main__":
    main()
