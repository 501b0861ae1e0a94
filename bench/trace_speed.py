"""Trace analysis speed: doctor report against json.load and Holistic Trace Analysis (issue 21).

    python bench/trace_speed.py                   # the default set, median of 3
    python bench/trace_speed.py --hta             # and HTA's load (its own venv, made once)
    python bench/trace_speed.py --big             # and the 4 GB synthetic trace (doctor only)
    python bench/trace_speed.py --big-only --bigger   # 4 GB and 8 GB: is memory bounded?
    python bench/trace_speed.py TRACE... --repeat 5 --python .venv/bin/python

The default set: two shared traces (a100_rank0_of_16_pageable, ddp_v100_rank1_of_2) and ten
time-shifted copies of the second (about 2.2 M events, 470 MB of JSON), which bench/synth_trace.py
builds into the cache directory (default /tmp/doctor-bench) when absent; ``--big`` adds 4 GB of
JSON made the same way (gzipped, built once, analysed by doctor only: json.load would need
tens of GB).

Each measurement is a fresh process, timed from start to exit (interpreter start-up and imports
included, as a user sees it), its peak RSS the largest of the child's and its own children's
(``ru_maxrss`` from ``os.wait4``), and beside it the most the child and its children held
together (their PSS summed, sampled every 50 ms: doctor reads a large trace on several
processes), with a clean environment (no PYTHONPATH or other PYTHON* variable) and a neutral
working directory:

- ``doctor``: ``PYTHON -m doctor.cli report TRACE --format json`` (``--python``, default this
  interpreter; the worktree's venv);
- ``json.load``: gzip (when gzipped) and ``json.load`` of the whole file, in the same interpreter;
- ``hta`` (``--hta``): ``TraceAnalysis(trace_dir=DIR)`` of HolisticTraceAnalysis, where DIR holds
  only a link to the trace (HTA reads a directory with one file per rank), in a venv of its own
  (``CACHE/hta-venv``, made on the first ``--hta`` with ``pip install HolisticTraceAnalysis``;
  never a dependency of doctor).

Prints, per trace, the median (and range) of N runs of each, their peak memory, the ratios
(json.load's time / doctor's: how many times faster doctor is; the same for HTA), the trace reader
and gunzip doctor says it used (any key named ``reader`` or ``gunzip`` in its JSON output), and
the issue's targets. ``--bigger`` adds 8 GB of JSON to ``--big``: doctor keeps at most
doctor.trace.budget.MAX_EVENTS events of a trace, so its peak should not grow from 4 GB to 8.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SYNTH = ROOT / "bench" / "synth_trace.py"
TRACES = ROOT.parent / "shared" / "traces"
if not TRACES.is_dir():
    TRACES = Path("/work/shared/traces")
DEFAULT_TRACES = ["a100_rank0_of_16_pageable.json.gz", "ddp_v100_rank1_of_2.json.gz"]
SYNTH_SOURCE = "ddp_v100_rank1_of_2.json.gz"
X10_NAME = "ddp_v100_rank1_of_2_x10.json.gz"
BIG_NAME = "ddp_v100_rank1_of_2_4G.json.gz"
BIG_SIZE = "4G"
#: Twice the big one: memory that does not grow from one to the other is bounded.
BIGGER_NAME = "ddp_v100_rank1_of_2_8G.json.gz"
BIGGER_SIZE = "8G"

JSON_LOAD = r"""
import gzip, json, sys
path = sys.argv[1]
with open(path, "rb") as fh:
    gz = fh.read(2) == b"\x1f\x8b"
with (gzip.open(path, "rt", encoding="utf-8") if gz else open(path, encoding="utf-8")) as fh:
    data = json.load(fh)
events = data.get("traceEvents", []) if isinstance(data, dict) else data
print(len(events))
"""

HTA_LOAD = r"""
import logging, sys
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
analyzer = TraceAnalysis(trace_dir=sys.argv[1])
traces = analyzer.t.traces
print(sum(len(df) for df in traces.values()))
"""


@dataclass
class Run:
    seconds: float
    peak_mb: float  # the largest RSS of the process or any of its children (wait4)
    rc: int
    stdout: str = ""
    stderr_tail: str = ""
    tree_mb: float = float("nan")  # the most memory of the process and its children together


@dataclass
class Tool:
    name: str
    runs: list[Run] = field(default_factory=list)
    reader: list[str] = field(default_factory=list)
    events: int | None = None
    skipped: str = ""

    @property
    def ok(self) -> list[Run]:
        return [r for r in self.runs if r.rc == 0]

    @property
    def failed(self) -> Run | None:
        return next((r for r in self.runs if r.rc != 0), None)

    def median_s(self) -> float | None:
        return statistics.median(r.seconds for r in self.ok) if self.ok else None

    def median_mb(self) -> float | None:
        return statistics.median(r.peak_mb for r in self.ok) if self.ok else None


def clean_env() -> dict[str, str]:
    """This environment less every PYTHON* variable (PYTHONPATH above all) and any venv's."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PYTHON") and k not in ("VIRTUAL_ENV", "CONDA_PREFIX")}
    env["PYTHONHASHSEED"] = "0"
    return env


def run_child(argv: list[str], cwd: Path, timeout: float, stdout_path: Path) -> Run:
    """Run argv in a fresh process group; wall time and the child's own peak RSS (wait4)."""
    with stdout_path.open("wb") as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=cwd, env=clean_env(), stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        timed_out = threading.Event()

        def kill() -> None:
            timed_out.set()
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        timer = threading.Timer(timeout, kill)
        timer.start()
        tree = TreeMemory(proc.pid)
        tree.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:  # interrupted: take the child's whole group down with us
            kill()
            os.wait4(proc.pid, 0)
            raise
        finally:
            timer.cancel()
            tree.stop()
        seconds = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        tail = err.read().decode("utf-8", "replace").strip().splitlines()[-3:]
    rc = 124 if timed_out.is_set() else proc.returncode
    if timed_out.is_set():
        tail = [f"timed out after {timeout:.0f} s", *tail]
    return Run(seconds, usage.ru_maxrss / 1024.0, rc,
               stdout_path.read_text("utf-8", "replace"), " | ".join(tail), tree.peak_mb)


class TreeMemory(threading.Thread):
    """The most memory a process and its children held together, sampled every 50 ms: the sum
    of their proportional set sizes (PSS: a page shared by n processes counts 1/n in each, so a
    forked worker's copy-on-write pages are not counted twice)."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak_mb = float("nan")
        self._done = threading.Event()

    def run(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.pid)
        except psutil.Error:
            return
        while not self._done.wait(0.05):
            total = 0
            try:
                for proc in [root, *root.children(recursive=True)]:
                    total += proc.memory_full_info().pss
            except psutil.Error:
                continue
            mb = total / (1 << 20)
            self.peak_mb = mb if not self.peak_mb >= mb else self.peak_mb

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=1)


def find_key(obj: Any, key: str) -> list[Any]:
    found: list[Any] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == key or k.endswith("_" + key):  # "reader", "trace_reader", "trace_gunzip"
                found.append(v)
            found += find_key(v, key)
    elif isinstance(obj, list):
        for v in obj:
            found += find_key(v, key)
    return found


def readers_of(stdout: str) -> list[str]:
    try:
        data = json.loads(stdout)
    except ValueError:
        return []
    out: list[str] = []
    for value in find_key(data, "reader") + find_key(data, "gunzip"):
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        if text not in out:
            out.append(text)
    return out


def hta_python(cache: Path, make: bool) -> tuple[Path | None, str]:
    """The HTA venv's python (made on request), or None and why not."""
    venv = cache / "hta-venv"
    py = venv / "bin" / "python"
    check = [str(py), "-c", "import hta.trace_analysis"]
    if py.exists() and subprocess.run(check, env=clean_env(), capture_output=True).returncode == 0:
        return py, ""
    if not make:
        return None, "no HTA venv"
    log = cache / "hta-install.log"
    print(f"making {venv} (pip install HolisticTraceAnalysis; log in {log}) ...", flush=True)
    with log.open("w") as fh:
        steps = [[sys.executable, "-m", "venv", str(venv)],
                 [str(py), "-m", "pip", "install", "HolisticTraceAnalysis"]]
        for argv in steps:
            if subprocess.run(argv, env=clean_env(), stdout=fh, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL).returncode != 0:
                lines = [ln for ln in log.read_text().splitlines()
                         if ln.strip() and "is ignored: it is neither" not in ln]
                return None, f"{' '.join(argv[-2:])} failed: {lines[-1] if lines else '?'}"
    if subprocess.run(check, env=clean_env(), capture_output=True).returncode != 0:
        return None, f"HTA installed but does not import (see {log})"
    return py, ""


def hta_dir(cache: Path, trace: Path) -> Path:
    """A directory holding only a link to the trace: HTA reads every trace file of a folder."""
    d = cache / "hta-dirs" / trace.name.split(".")[0]
    d.mkdir(parents=True, exist_ok=True)
    link = d / trace.name
    if not (link.is_symlink() and link.resolve() == trace.resolve()):
        link.unlink(missing_ok=True)
        link.symlink_to(trace.resolve())
    return d


def synth(cache: Path, name: str, how: list[str]) -> Path:
    out = cache / name
    info_path = cache / (name + ".info.json")
    if not (out.exists() and info_path.exists()):
        # In a child: the source trace it loads must not swell this process, whose peak RSS is
        # the floor of every child's ru_maxrss (a forked child starts with its parent's pages).
        print(f"building {out} from {SYNTH_SOURCE} ...", flush=True)
        argv = [sys.executable, str(SYNTH), str(TRACES / SYNTH_SOURCE), "-o", str(out),
                "--info", str(info_path), *how]
        if subprocess.run(argv, env=clean_env(), stdin=subprocess.DEVNULL).returncode != 0:
            sys.exit(f"could not build {out}")
    return out


def trace_facts(path: Path) -> dict[str, Any]:
    """Events and decoded size: from the synthetic trace's sidecar, else by reading it."""
    info = path.with_name(path.name + ".info.json")
    if info.exists():
        data = json.loads(info.read_text())
        return {"events": data["events"], "json_mb": data["json_bytes"] / 1e6}
    with path.open("rb") as fh:
        gz = fh.read(2) == b"\x1f\x8b"
    size = 0
    with (gzip.open(path, "rb") if gz else path.open("rb")) as fh:
        while chunk := fh.read(1 << 22):
            size += len(chunk)
    return {"events": None, "json_mb": size / 1e6}


def measure_trace(path: Path, args: argparse.Namespace, hta_py: Path | None,
                  doctor_only: bool, repeat: int) -> dict[str, Tool]:
    cache: Path = args.cache
    work = cache / "work"
    work.mkdir(parents=True, exist_ok=True)
    out = cache / "out"
    out.mkdir(parents=True, exist_ok=True)
    tools = {"doctor": Tool("doctor report"), "json": Tool("json.load"), "hta": Tool("HTA load")}
    plans: list[tuple[str, list[str]]] = [
        ("doctor", [args.python, "-m", "doctor.cli", "report", str(path), "--format", "json"])]
    if doctor_only:
        tools["json"].skipped = tools["hta"].skipped = "not run on this trace (size)"
    else:
        plans.append(("json", [args.python, "-c", JSON_LOAD, str(path)]))
        if hta_py is not None:
            plans.append(("hta", [str(hta_py), "-c", HTA_LOAD, str(hta_dir(cache, path))]))
        else:
            tools["hta"].skipped = args.hta_why
    for i in range(repeat):
        for key, argv in plans:  # interleaved, so a slow spell of the machine hits all alike
            tool = tools[key]
            if tool.failed is not None:
                continue
            run = run_child(argv, work, args.timeout, out / f"{key}.out")
            tool.runs.append(run)
            if key == "doctor" and i == 0:
                tool.reader = readers_of(run.stdout)
            note = "" if run.rc == 0 else f"  FAILED rc={run.rc}: {run.stderr_tail}"
            print(f"    {tool.name:14s} run {i + 1}/{repeat}: {run.seconds:7.2f} s "
                  f"{run.peak_mb:8.0f} MB (with its children: {run.tree_mb:.0f} MB PSS){note}",
                  flush=True)
            if key in ("json", "hta") and run.rc == 0 and run.stdout.strip().isdigit():
                tool.events = int(run.stdout.strip())
    return tools


def fmt_s(tool: Tool) -> str:
    if tool.skipped:
        return "-"
    if not tool.ok:
        bad = tool.failed
        return f"failed rc={bad.rc}" if bad else "-"
    secs = [r.seconds for r in tool.ok]
    spread = f" ({min(secs):.2f}-{max(secs):.2f})" if len(secs) > 1 else ""
    return f"{statistics.median(secs):.2f}{spread}"


def fmt_mb(tool: Tool) -> str:
    mb = tool.median_mb()
    return "-" if mb is None else f"{mb:.0f}"


def ratio(other: Tool, doctor: Tool) -> str:
    a, b = other.median_s(), doctor.median_s()
    return "-" if a is None or b is None or b <= 0 else f"{a / b:.2f}x"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="*", type=Path,
                    help="traces to measure (default: the two shared traces and the x10 one)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each, median (default 3)")
    ap.add_argument("--python", default=sys.executable,
                    help="the interpreter that runs doctor and json.load (default this one)")
    ap.add_argument("--hta", action="store_true",
                    help="measure HTA's load too (makes CACHE/hta-venv when absent)")
    ap.add_argument("--big", action="store_true",
                    help="add the 4 GB synthetic trace (built once; doctor only)")
    ap.add_argument("--big-only", action="store_true", help="the 4 GB synthetic trace alone")
    ap.add_argument("--bigger", action="store_true",
                    help="with --big or --big-only, an 8 GB one too (is memory bounded?)")
    ap.add_argument("--big-repeat", type=int, default=1, help="runs on the 4 GB trace (1)")
    ap.add_argument("--max-load-mb", type=float, default=2500.0,
                    help="traces of more JSON than this are run by doctor only (2500)")
    ap.add_argument("--cache", type=Path, default=Path("/tmp/doctor-bench"),
                    help="synthetic traces, the HTA venv, outputs (default /tmp/doctor-bench)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per run (600)")
    ap.add_argument("--save", type=Path, help="write the results as JSON here")
    args = ap.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    args.hta_why = "--hta not given"

    where = subprocess.run([args.python, "-c", "import doctor, sys; print(doctor.__file__); "
                            "print(sys.version.split()[0])"], cwd=args.cache, env=clean_env(),
                           capture_output=True, text=True)
    if where.returncode != 0:
        sys.exit(f"{args.python} cannot import doctor: {where.stderr.strip().splitlines()[-1:]}")
    doctor_file, py_version = where.stdout.split()
    print(f"doctor: {Path(doctor_file).parent} (python {py_version}, {args.python})")
    floor = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    hta_py = None
    if args.hta:
        hta_py, args.hta_why = hta_python(args.cache, make=True)
        if hta_py is None:
            print(f"HTA: not measured: {args.hta_why}")
        else:
            ver = subprocess.run([str(hta_py), "-c", "import importlib.metadata as m; "
                                  "print(m.version('HolisticTraceAnalysis'))"],
                                 env=clean_env(), capture_output=True, text=True).stdout.strip()
            print(f"HTA: HolisticTraceAnalysis {ver} ({hta_py})")

    traces: list[tuple[Path, bool]] = [(p, False) for p in args.traces]
    if not traces and not args.big_only:
        traces = [(TRACES / n, False) for n in DEFAULT_TRACES]
        traces.append((synth(args.cache, X10_NAME, ["--copies", "10"]), False))
    if args.big or args.big_only:
        traces.append((synth(args.cache, BIG_NAME, ["--bytes", BIG_SIZE]), True))
        if args.bigger:
            traces.append((synth(args.cache, BIGGER_NAME, ["--bytes", BIGGER_SIZE]), True))
    for p, _ in traces:
        if not p.exists():
            sys.exit(f"{p}: no such trace")

    results = []
    for path, big in traces:
        facts = trace_facts(path)
        print(f"{path.name}: {path.stat().st_size / 1e6:.1f} MB on disk, "
              f"{facts['json_mb']:.0f} MB JSON", flush=True)
        big = big or facts["json_mb"] > args.max_load_mb
        tools = measure_trace(path, args, hta_py, doctor_only=big,
                              repeat=args.big_repeat if big else args.repeat)
        if facts["events"] is None:
            facts["events"] = tools["json"].events
        results.append((path, facts, tools, big))

    print()
    big_note = f" (doctor only: {args.big_repeat})" if any(r[3] for r in results) else ""
    print(f"median of {args.repeat} fresh processes{big_note}; "
          "s: wall time, start-up included; MB: peak RSS; vs: the other's time / doctor's")
    floor = max(floor, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print(f"(this process peaked at {floor:.0f} MB: no child's peak reads lower)")
    head = (f"{'trace':36s} {'events':>9s} {'JSON MB':>8s} | {'doctor s':>19s} {'MB':>6s} | "
            f"{'json.load s':>19s} {'MB':>6s} | {'HTA s':>19s} {'MB':>6s} | "
            f"{'vs json':>7s} {'vs HTA':>7s}")
    print(head)
    print("-" * len(head))
    saved = []
    for path, facts, tools, _ in results:
        d, j, h = tools["doctor"], tools["json"], tools["hta"]
        events = f"{facts['events'] / 1e3:.0f} k" if facts["events"] else "?"
        print(f"{path.name[:36]:36s} {events:>9s} {facts['json_mb']:8.0f} | "
              f"{fmt_s(d):>19s} {fmt_mb(d):>6s} | {fmt_s(j):>19s} {fmt_mb(j):>6s} | "
              f"{fmt_s(h):>19s} {fmt_mb(h):>6s} | {ratio(j, d):>7s} {ratio(h, d):>7s}")
        saved.append({"trace": str(path), **facts,
                      **{k: {"median_s": t.median_s(), "median_peak_mb": t.median_mb(),
                             "runs": [[r.seconds, r.peak_mb, r.rc, r.tree_mb] for r in t.runs],
                             "skipped": t.skipped} for k, t in tools.items()},
                      "reader": tools["doctor"].reader})
    print()
    for path, _, tools, _ in results:
        d = tools["doctor"]
        print(f"{path.name}: doctor's reader: {', '.join(d.reader) if d.reader else 'not said'}"
              f"; peak memory doctor {fmt_mb(d)} MB, json.load {fmt_mb(tools['json'])} MB, "
              f"HTA {fmt_mb(tools['hta'])} MB")
        if d.failed is not None:
            print(f"  doctor failed: {d.failed.stderr_tail}")
    skipped = {t.skipped for _, _, tl, _ in results if (t := tl["hta"]).skipped}
    if skipped:
        print(f"HTA: {'; '.join(sorted(skipped))}")
    print()
    print("issue 21's targets:")
    for path, facts, tools, _ in results:
        d = tools["doctor"]
        ds, dmb = d.median_s(), d.median_mb()
        ev = facts["events"] or 0
        checks = []
        if ev >= 1_500_000 and facts["json_mb"] < 1500:
            checks += [("5x json.load", _ge(tools["json"], d, 5)),
                       ("20x HTA", _ge(tools["hta"], d, 20)),
                       ("< 200 MB", None if dmb is None else dmb < 200)]
        if 50_000 <= ev <= 150_000:
            checks.append(("< 1 s", None if ds is None else ds < 1.0))
        if 3000 <= facts["json_mb"] < 6000:
            checks.append(("< 60 s", None if ds is None else ds < 60.0))
        if facts["json_mb"] >= 6000 and dmb is not None:  # against the 4 GB one's peak
            half = [t["doctor"].median_mb() for p, f, t, _ in results
                    if 3000 <= f["json_mb"] < 6000]
            checks.append(("bounded memory (peak within 10% of the 4 GB trace's)",
                           None if not half or half[0] is None else dmb <= 1.1 * half[0]))
        if checks:
            print(f"  {path.name}: " + ", ".join(
                f"{name} {'-' if ok is None else 'met' if ok else 'NOT met'}"
                for name, ok in checks))
    if args.save:
        args.save.write_text(json.dumps(saved, indent=1))
        print(f"results in {args.save}")


def _ge(other: Tool, doctor: Tool, factor: float) -> bool | None:
    a, b = other.median_s(), doctor.median_s()
    return None if a is None or b is None else a / b >= factor


if __name__ == "__main__":
    main()
