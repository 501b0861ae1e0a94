"""The memory breakdown against the bytes each memory sample job computes from its own shapes.

Runs every memory sample job under ``doctor run``, with and without its switch, and prints, per
part, what the job says it holds (its ``{"expected": ...}`` line) beside what doctor measured,
and whether the finding the job is built for came and went with the switch.

    python bench/memory_accuracy.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
JOBS = ROOT / "sample_jobs"

#: (job, switch, arguments, [(part in the verdict, key the job prints)], the finding)
CASES: list[tuple[str, str, list[str], list[tuple[str, str]], str | None]] = [
    ("activation_heavy", "--checkpoint", ["--steps", "30"],
     [("parameters_bytes", "parameters_bytes"), ("activations_bytes", "activations_bytes")],
     None),
    ("optimizer_state_heavy", "--sgd", ["--steps", "30"],
     [("parameters_bytes", "parameters_bytes"), ("gradients_bytes", "parameters_bytes"),
      ("optimizer_state_bytes", "optimizer_state_bytes")], None),
    ("memory_creep", "--item", [], [("growth_per_step", "kept_per_step_bytes")],
     "memory.creep"),
    ("worker_memory_growth", "--arrays", ["--rows", "250000", "--passes", "6"],
     [("worker_growth", "dataset_bytes")], "memory.worker_growth"),
]


def run(job: str, args: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        result = subprocess.run(
            [sys.executable, "-m", "doctor.cli", "run", "--out", str(out), "--",
             sys.executable, str(JOBS / f"{job}.py"), *args],
            capture_output=True, text=True, cwd=ROOT, check=False)
        if result.returncode != 0:
            raise SystemExit(f"{job} {args} failed: {result.stderr.strip()[-300:]}")
        expected = next(json.loads(line)["expected"] for line in result.stdout.splitlines()
                        if line.startswith('{"expected"'))
        return json.loads((out / "verdict.json").read_text()), expected


def measured(verdict: dict[str, Any], part: str) -> float | None:
    m = verdict["memory"]["ranks"][0]
    if part == "growth_per_step":
        return m["growth"]["bytes_per_step"] if m.get("growth") else None
    if part == "worker_growth":
        found = verdict["memory"]["workers"]
        return found[0]["median_growth_bytes"] if found else None
    value = m.get(part)
    return float(value) if value is not None else None


def main() -> None:
    print(f"{'job':24s} {'side':12s} {'part':24s} {'computed':>12s} {'measured':>12s} "
          f"{'ratio':>6s}  finding")
    for job, switch, args, parts, finding in CASES:
        for side in ("", switch):
            verdict, expected = run(job, [*args, *([side] if side else [])])
            ids = [f["id"] for f in verdict["findings"]]
            said = "" if finding is None else (f"{finding}: {'yes' if finding in ids else 'no'}")
            for part, key in parts:
                want, got = expected.get(key), measured(verdict, part)
                ratio = f"{got / want:.3f}" if want and got is not None else "-"
                print(f"{job:24s} {side or '(as is)':12s} {part:24s} "
                      f"{_mib(want):>12s} {_mib(got):>12s} {ratio:>6s}  {said}")


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**20:.2f} MiB"


if __name__ == "__main__":
    main()
