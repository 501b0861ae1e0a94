"""What doctor's bootstrap adds to the start of each Python process of a job (the budget: under
20 ms; nothing heavy imported before the job's first line).

Every process of a job under ``doctor run`` starts with the bootstrap on its path
(doctor.record._bootstrap.sitecustomize), the DataLoader workers and the helpers a job starts
(``python -c ...``) included. This starts ``python -c pass`` N times each way, alternating, in
the environment doctor run gives a job (PYTHONPATH, DOCTOR_RUN_DIR: the process records into a
fresh run directory) and bare, and prints the medians and their difference.

    python bench/startup.py --runs 20
    python bench/startup.py --runs 20 --no-compile   # as if doctor run wrote no bytecode

``doctor run`` writes the bytecode of doctor's in-job modules before it starts a job
(doctor.record.bytecode); this bench does the same, unless ``--no-compile``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from doctor.launch import job_environment, probes_dir  # noqa: E402
from doctor.record.bytecode import compile_missing, in_job_sources  # noqa: E402


def start_s(env: dict[str, str], code: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one ``python -c CODE``: the CPU time, the kernel's
    accounting of the child, moves less than the wall time on a busy machine."""
    t0 = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", code], env=env)
    _pid, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - t0
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise SystemExit(f"python -c {code!r} exited {child.returncode}")
    return wall, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--code", default="pass", help="the process's code (default: pass)")
    parser.add_argument("--no-compile", action="store_true",
                        help="do not write doctor's in-job bytecode first, as doctor run does "
                             "(what a process pays under PYTHONDONTWRITEBYTECODE=1 without it)")
    args = parser.parse_args()
    if not args.no_compile:
        compile_missing(in_job_sources(probes_dir()))
    bare = dict(os.environ)
    for name in [n for n in bare if n.startswith("DOCTOR_")]:
        bare.pop(name)
    with tempfile.TemporaryDirectory() as tmp:
        under = job_environment(Path(tmp), None, base=bare)
        under["DOCTOR_PARENT_PID"] = "1"  # no tracer to name: the bench is not the parent
        for env in (bare, under):  # warm the page cache both ways
            start_s(env, args.code)
        times: dict[str, list[tuple[float, float]]] = {"bare": [], "doctor": []}
        for _ in range(args.runs):
            times["bare"].append(start_s(bare, args.code))
            times["doctor"].append(start_s(under, args.code))
        loaded = subprocess.run(
            [sys.executable, "-c", "import sys; print(len(sys.modules), "
             "sorted({m.split('.')[0] for m in sys.modules} & {'numpy', 'torch', 'pandas'}))"],
            env=under, capture_output=True, text=True, check=True).stdout.strip()
    print(f"python -c {args.code!r}, {args.runs} runs each, alternating; "
          f"PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r}, "
          f"doctor's in-job bytecode {'not ' if args.no_compile else ''}written first")
    med: dict[str, tuple[float, float]] = {}
    for k, v in times.items():
        wall, cpu = ([r[i] for r in v] for i in (0, 1))
        med[k] = (statistics.median(wall), statistics.median(cpu))
        print(f"  {k:7s} wall median {med[k][0] * 1e3:6.1f} ms (min {min(wall) * 1e3:.1f}, "
              f"max {max(wall) * 1e3:.1f}); CPU median {med[k][1] * 1e3:6.1f} ms")
    print(f"  added by the bootstrap: wall {(med['doctor'][0] - med['bare'][0]) * 1e3:+.1f} ms, "
          f"CPU {(med['doctor'][1] - med['bare'][1]) * 1e3:+.1f} ms; "
          f"modules then loaded, heavy ones: {loaded}")


if __name__ == "__main__":
    main()
