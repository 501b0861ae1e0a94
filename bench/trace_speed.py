"""Trace parsing: throughput and peak memory of doctor's streaming reader against json.load.

    python bench/trace_speed.py [TRACE]   # default: the largest trace in ../shared/traces

Each measurement runs in a fresh subprocess, so peak RSS (ru_maxrss) belongs to that parser
alone; the figures are MB of *decoded* JSON per second and the peak RSS above the interpreter's
baseline. Prints one line per parser and the ratios.
"""

from __future__ import annotations

import argparse
import gzip
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces"

CHILD = r"""
import gc, gzip, json, resource, sys, time
sys.path.insert(0, {root!r})
mode, path = sys.argv[1], sys.argv[2]
import doctor.trace.reader as reader
if mode == "steps":
    from doctor.trace.steps import trace_step_frame
gc.collect()
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
if mode == "stream":
    n = sum(1 for _ in reader.iter_events(path))
elif mode == "steps":
    n = len(trace_step_frame(path))
else:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as fh:
        data = json.load(fh)
    n = len(data["traceEvents"] if isinstance(data, dict) else data)
dt = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(dt, (peak - base) / 1024.0, n)
"""


def decoded_mb(path: Path) -> float:
    opener = gzip.open if path.suffix == ".gz" else open
    size = 0
    with opener(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            size += len(chunk)
    return size / 1e6


def measure(mode: str, path: Path) -> tuple[float, float, int]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD.format(root=str(ROOT)), mode, str(path)],
        check=True, capture_output=True, text=True,
    ).stdout.split()
    return float(out[0]), float(out[1]), int(out[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", type=Path)
    args = parser.parse_args()
    path = args.trace
    if path is None:
        candidates = sorted(TRACES.rglob("*.json*"), key=lambda p: p.stat().st_size)
        if not candidates:
            sys.exit(f"no trace given and none under {TRACES}")
        path = candidates[-1]
    size = decoded_mb(path)
    print(f"{path.name}: {path.stat().st_size / 1e6:.1f} MB on disk, {size:.1f} MB decoded JSON")
    results = {}
    for mode in ("json.load", "stream", "steps"):
        t0 = time.perf_counter()
        dt, peak_mb, n = measure(mode, path)
        results[mode] = (dt, peak_mb)
        print(f"  {mode:10s} {size / dt:7.1f} MB/s  {dt:6.2f} s  peak +{peak_mb:7.1f} MB RSS  "
              f"({n} {'steps' if mode == 'steps' else 'events'}; "
              f"{time.perf_counter() - t0:.1f} s with start-up)")
    base_dt, base_mem = results["json.load"]
    for mode in ("stream", "steps"):
        dt, mem = results[mode]
        print(f"  {mode} vs json.load: {base_dt / dt:.2f}x throughput, "
              f"{mem / base_mem if base_mem > 0 else float('nan'):.2f}x peak memory")


if __name__ == "__main__":
    main()
