"""Accuracy of the fixes doctor gives each kind of parallelism (issue 36), on the 2-rank gloo
sample jobs: the estimate of the fix that removes the job's cost, against the speedup its switch
measures.

Per repeat and job:

1. ``doctor run -- torchrun --nproc-per-node 2 JOB ARGS``: the verdict, and the estimated
   speedup of the first fix of ``comm.exposed`` whose title holds the job's fix words (``-``
   where doctor gives that fix no estimate, and ``missing`` where it does not give it; a
   pipeline's more micro-batches: the bound it gives instead, as doctor says it);
2. the job bare with ``--ablate N`` and its switch: the job and the job switched, timed in one
   process in alternating blocks (sample_jobs/_timing.py), so that a loaded machine moves both
   sides; measured = the job's median step over the switched one's.

    python bench/kinds_accuracy.py [--repeat 2] [--jobs sync_stats ...] [--json rows.json]

Jobs whose package is not installed (deepspeed) are left out, said once.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from comm_accuracy import torchrun  # a sample job under torchrun, bare or under doctor run


@dataclass(frozen=True)
class Kind:
    job: str  # sample_jobs/JOB.py
    fix: str  # words of the fix's title
    args: tuple[str, ...]  # the job as doctor runs it
    ablate: tuple[str, ...]  # the job and its switch, in one process
    needs: str = ""  # a package the job imports
    bound: str = ""  # the evidence key of the bound doctor gives where it gives no estimate


KINDS = {
    "fsdp reshard": Kind("fsdp_sharded", "reshard_after_forward=False", ("--steps", "40"),
                         ("--steps", "80", "--ablate", "10", "--no-reshard")),
    "syncbn plain norm": Kind("sync_stats", "plain BatchNorm", ("--steps", "60"),
                              ("--steps", "80", "--ablate", "10")),
    "zero-1 bucket view": Kind("zero_optimizer", "parameters_as_bucket_view", ("--steps", "60"),
                               ("--steps", "80", "--ablate", "10", "--bucket-view")),
    "ddp accumulation no_sync": Kind("ddp_allreduce_bound", "no_sync",
                                     ("--steps", "30", "--accumulate", "4"),
                                     ("--steps", "40", "--accumulate", "4", "--ablate", "5")),
    "pipeline micro-batches": Kind("pipeline_stages", "more micro-batches", ("--steps", "60"),
                                   ("--steps", "80", "--ablate", "10"),
                                   bound="more_microbatches_at_most"),
    "pipeline, device-like": Kind("pipeline_stages", "more micro-batches",
                                  ("--stage-compute", "sleep", "--steps", "60"),
                                  ("--stage-compute", "sleep", "--steps", "80", "--ablate", "10"),
                                  bound="more_microbatches_at_most"),
    "tensor parallel -> data parallel": Kind("tensor_parallel", "Data parallel instead",
                                             ("--steps", "40"),
                                             ("--steps", "100", "--ablate", "10")),
    "deepspeed zero-3 -> 2": Kind("deepspeed_zero", "stage 3 -> 2",
                                  ("--stage", "3", "--steps", "40"),
                                  ("--stage", "3", "--switch-stage", "2", "--steps", "80",
                                   "--ablate", "10"), needs="deepspeed"),
}


def ablation(out: str) -> float:
    for line in reversed(out.splitlines()):
        if line.startswith("{") and "switched_median_step_s" in line:
            timing = json.loads(line)
            return float(timing["median_step_s"]) / float(timing["switched_median_step_s"])
    raise SystemExit("the job printed no ablation line")


def estimate(run_dir: Path, kind: Kind) -> tuple[str, float | str | None]:
    verdict = json.loads((run_dir / "verdict.json").read_text())
    found = {f["id"]: f for f in verdict["findings"]}
    fixes = found.get("comm.exposed", {}).get("fixes", [])
    fix = next((f for f in fixes if kind.fix.lower() in f["title"].lower()), None)
    if fix is None:
        return verdict["bottleneck"], "missing"
    if fix.get("estimated_speedup") is None and kind.bound:
        bound = _find(found["comm.exposed"]["evidence"], kind.bound)
        if bound:
            return verdict["bottleneck"], float(bound)  # a bound, not an estimate (the fix says)
    return verdict["bottleneck"], fix.get("estimated_speedup")


def _find(evidence: Any, key: str) -> Any:
    """The value of ``key`` anywhere in the (nested) evidence; None where it is not."""
    if isinstance(evidence, dict):
        if key in evidence:
            return evidence[key]
        for value in evidence.values():
            if (found := _find(value, key)) is not None:
                return found
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", nargs="+", default=list(KINDS), choices=list(KINDS))
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.jobs:
            kind = KINDS[name]
            if kind.needs and importlib.util.find_spec(kind.needs) is None:
                print(f"  {name}: left out ({kind.needs} is not installed)")
                continue
            for r in range(args.repeat):
                run_dir = Path(tmp) / f"{name.replace(' ', '_')}-{r}"
                torchrun(kind.job, *kind.args, under=run_dir)
                verdict, est = estimate(run_dir, kind)
                measured = ablation(torchrun(kind.job, *kind.ablate).stdout)
                rows.append({"kind": name, "verdict": verdict, "estimate": est,
                             "measured": measured})
                print(f"  {name} {r + 1}: {verdict}, est {est}, measured {measured:.2f}x",
                      flush=True)
    print(f"\n{'kind':26} {'estimates':22} {'measured':22} ratio  ±25%")
    for name in dict.fromkeys(r["kind"] for r in rows):
        mine = [r for r in rows if r["kind"] == name]
        ests = [r["estimate"] for r in mine]
        meas = [r["measured"] for r in mine]
        numbers = [e for e in ests if isinstance(e, float)]
        ratio = statistics.median(numbers) / statistics.median(meas) if numbers else None
        shown = ", ".join(f"{e:.2f}x" if isinstance(e, float) else str(e or "-") for e in ests)
        print(f"{name:26} {shown:22} {', '.join(f'{m:.2f}x' for m in meas):22} "
              f"{'' if ratio is None else f'{ratio:.2f}':5}  "
              f"{'' if ratio is None else ('yes' if abs(ratio - 1) <= 0.25 else 'no')}")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
