"""What py-spy's stack sampling costs a process, by its thread count and the sampling mode.

A synthetic job (torch matmuls on the training thread; ``--torch-threads`` intra-op threads and
``--idle-threads`` idle Python threads beside it) prints each step's duration; py-spy records it
for a few seconds in each mode, one after another in the same job, with unsampled stretches
between, ``--repeat`` rounds of every mode interleaved; the ratio of the median step while
sampled to the median step unsampled around it is the cost, and the median over the rounds is
printed. Mode ``none`` samples nothing: its ratio is the machine's noise. Run:

    python bench/stack_cost.py                     # the default grid, ~8 minutes
    python bench/stack_cost.py --threads 1:64 --modes none:0,blocking:50,nonblocking:50

Prints one row per (threads, mode): the rounds' median ratio, their range and the samples taken,
and (``--json``) every round's row.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from doctor.probes.stacks import find_py_spy

JOB = r"""
import sys, threading, time, torch
torch_threads, idle = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(torch_threads)
stop = threading.Event()
for _ in range(idle):
    threading.Thread(target=stop.wait, daemon=True).start()
a = torch.randn(192, 192)
# a step of ~20 ms: matmuls, and some Python between them
print("ready", flush=True)
while True:
    t0 = time.perf_counter()
    for _ in range(40):
        b = a @ a
        s = sum(range(200))
    print(f"{time.monotonic():.6f} {time.perf_counter() - t0:.6f}", flush=True)
"""


def measure(torch_threads: int, idle: int, modes: list[tuple[str, int]], seconds: float,
            py_spy: str, repeat: int) -> list[dict]:
    job = subprocess.Popen([sys.executable, "-c", JOB, str(torch_threads), str(idle)],
                           stdout=subprocess.PIPE, text=True)
    assert job.stdout is not None
    job.stdout.readline()
    steps: list[tuple[float, float]] = []

    def read() -> None:
        assert job.stdout is not None
        for line in job.stdout:
            t, d = line.split()
            steps.append((float(t), float(d)))

    threading.Thread(target=read, daemon=True).start()
    time.sleep(2.0)  # warm-up
    spans = []
    for _ in range(repeat):
        for mode, rate in modes:
            time.sleep(seconds)  # unsampled before
            start = time.monotonic()
            if mode == "none":
                time.sleep(seconds)
                spans.append((mode, rate, start, time.monotonic(), ""))
                continue
            cmd = [py_spy, "record", "--pid", str(job.pid), "--rate", str(rate), "--duration",
                   str(int(seconds)), "--idle", "--threads", "--format", "raw", "--output",
                   "/dev/null"] + (["--nonblocking"] if mode == "nonblocking" else [])
            out = subprocess.run(cmd, capture_output=True, text=True)
            spans.append((mode, rate, start, time.monotonic(), out.stdout + out.stderr))
    time.sleep(seconds)
    job.kill()
    job.wait()
    threads = 1 + idle + max(torch_threads - 1, 0)
    rows = []
    for mode, rate, start, end, text in spans:
        inside = [d for t, d in steps if start + 0.5 <= t <= end - 0.2]
        outside = [d for t, d in steps if start - seconds <= t < start - 0.1
                   or end + 0.2 < t <= end + seconds]
        taken = text.rsplit("Samples: ", 1)[-1].split()[0] if "Samples: " in text else "?"
        rows.append({"torch_threads": torch_threads, "idle_threads": idle, "threads": threads,
                     "mode": mode, "rate_hz": rate,
                     "ratio": statistics.median(inside) / statistics.median(outside)
                     if inside and outside else float("nan"),
                     "samples": taken, "steps_inside": len(inside)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", default="1:0,1:16,1:64,32:0",
                    help="torch:idle pairs, comma separated")
    ap.add_argument("--modes", default="none:0,blocking:50,blocking:20,nonblocking:50")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path, help="also write every round's row to this file")
    args = ap.parse_args()
    py_spy = find_py_spy()
    if not py_spy:
        sys.exit("stack_cost: py-spy is not installed (pip install py-spy)")
    modes = [(m, int(r)) for m, r in (x.split(":") for x in args.modes.split(","))]
    rows = []
    for pair in args.threads.split(","):
        t, i = (int(x) for x in pair.split(":"))
        rows += measure(t, i, modes, args.seconds, py_spy, args.repeat)
    print(f"{'torch':>5} {'idle':>4} {'threads':>7} {'mode':>11} {'Hz':>3} {'ratio':>6} "
          f"{'range':>13} samples")
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["torch_threads"], r["idle_threads"], r["mode"], r["rate_hz"]),
                          []).append(r)
    for (t, i, mode, rate), rs in groups.items():
        ratios = sorted(r["ratio"] for r in rs)
        print(f"{t:5d} {i:4d} {rs[0]['threads']:7d} {mode:>11} {rate:3d} "
              f"{statistics.median(ratios):6.3f} {ratios[0]:6.3f}-{ratios[-1]:6.3f} "
              f"{rs[0]['samples']}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
