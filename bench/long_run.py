"""A long run without the wait: a 24-hour job's run directory, synthesised through the real
writers (a Session on a fake clock for the rings, the host sampler's bounded tables for
host.npz), then what it costs: disk bytes per file kind, the time and peak memory of each stage
of ``doctor report`` (load, analysis, timeline, HTML), and the size of what it writes.

    python bench/long_run.py                      # 24 h at 20 steps/s: 1.73 M steps (minutes)
    python bench/long_run.py --hours 2 --rate 20  # a quicker look
    python bench/long_run.py --keep runs/long     # keep the run directory
    python bench/long_run.py --hours 14 --capacity 2000000 --profile
                                                  # a ledger of 1 M steps, profiled

The job: a training loop (batch wait, forward, backward, optimizer step) with an evaluation pass
every ``--eval-every`` steps over its own loader, a checkpoint every ``--ckpt-every`` steps, a
new epoch (workers restarted) every ``--epoch-steps``, a gen-2 garbage collection every
``--gc-every`` steps, and ``--stalls`` long stalls (30 s) spread over the run. Peak memory is
the process's maximum RSS (resource.getrusage) after each stage: it only grows, so each figure
is the peak up to that stage.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from doctor.record.session import STEP_DATALOADER, Session  # noqa: E402
from doctor.store.records import checkpoint_key, gc_key, loader_key  # noqa: E402
from doctor.store.rundir import write_run_record  # noqa: E402
from doctor.store.samples import PROC_COLUMNS  # noqa: E402

FORWARD, BACKWARD, OPT = 0.35, 0.45, 0.1  # shares of a step after its batch wait


class Clock:
    def __init__(self) -> None:
        self.now = 10**12

    def __call__(self) -> int:
        return self.now


def synthesise(run_dir: Path, hours: float, rate: float, args: argparse.Namespace) -> int:
    """Record the job into ``run_dir``; the steps recorded."""
    clock = Clock()
    step_ns = int(1e9 / rate)
    wait_ns = step_ns // 10
    s = Session(run_dir, rank=0, clock=clock, window_start=10**9)
    train = s.record_loader({"num_workers": 4, "batch_size": 64, "pin_memory": True,
                             "persistent_workers": False, "dataset": "Train"})
    val = s.record_loader({"num_workers": 0, "batch_size": 64, "pin_memory": False,
                           "persistent_workers": False, "dataset": "Val"})
    total = int(hours * 3600 * rate)
    stall_at = {int(total * (k + 1) / (args.stalls + 1)) for k in range(args.stalls)}
    interval, tick = s.record_interval, 0

    def timed(name: str, ns: int, key: int = 0) -> None:
        t0 = clock.now
        clock.now += ns
        interval(name, t0, clock.now, key)

    timed("loader_iter", 50_000_000, train)
    t_start = clock.now
    wait_key = loader_key(train)
    for step in range(1, total + 1):
        tick = (tick * 1103515245 + 12345) & 0x7FFFFFFF  # a cheap, repeatable jitter
        jitter = (tick % 1000) * step_ns // 20_000  # up to 5 % of a step
        timed("loader_wait", wait_ns + jitter, wait_key)
        s.count_step(STEP_DATALOADER)
        rest = step_ns - wait_ns
        clock.now += int(rest * FORWARD)
        if step in stall_at:
            clock.now += 30 * 10**9  # a hung read, a long pause: 30 s
        timed("backward", int(rest * BACKWARD))
        if args.gc_every and step % args.gc_every == 0:
            timed("gc", 300_000_000, gc_key(2, 50_000))
        s.record_optimizer_start()
        clock.now += int(rest * OPT)
        s.record_optimizer_end(0)
        if args.eval_every and step % args.eval_every == 0:
            timed("loader_iter", 500_000, val)
            for _ in range(args.eval_batches):
                timed("loader_wait", step_ns // 4, loader_key(val, False))
                clock.now += step_ns // 4
            timed("loader_end", 100_000, val)
        if args.ckpt_every and step % args.ckpt_every == 0:
            timed("checkpoint", 4 * 10**9, checkpoint_key(0, 500 << 20))
        if args.epoch_steps and step % args.epoch_steps == 0 and step < total:
            timed("loader_end", 200_000_000, train)
            timed("loader_iter", 200_000_000, train)
    s.close()
    seconds = (clock.now - t_start) / 1e9
    write_run_record(run_dir, {"argv": ["python", "train.py"], "name": "train",
                               "t0_monotonic_s": t_start / 1e9 - 1.0, "cores": 8,
                               "exit_code": 0, "duration_s": seconds + 2.0})
    synthesise_host(run_dir, seconds, t_start / 1e9 - 1.0)
    return total


def synthesise_host(run_dir: Path, seconds: float, t0: float) -> None:
    """host.npz as the host sampler leaves it after ``seconds`` of 2 Hz ticks over the main
    process and its 4 workers (through its own bounded tables: probes.host)."""
    from doctor.probes.host import HostTables
    from doctor.store.samples import save_host

    tables = HostTables()
    pids = (1000, 1001, 1002, 1003, 1004)
    ticks = int(seconds * 2)
    for k in range(ticks):
        t = k * 0.5
        for i, pid in enumerate(pids):
            values = {"t_s": t, "pid": pid, "ppid": 999 if i == 0 else 1000,
                      "cpu_s": t * (0.9 if i == 0 else 0.3), "rss_bytes": 2e9,
                      "read_bytes": t * 1e6, "threads": 12, "run_delay_s": t * 0.01,
                      "private_bytes": 5e8, "comm_cpu_s": 0.0, "on_cpu_s": t * 0.85,
                      "read_count": t * 100, "read_chars": t * 4e6}
            # by name: a column the host table gains later reads 0 here, not a crash
            tables.add_proc(tuple(values.get(c, 0.0) for c in PROC_COLUMNS))
        tables.add_system((t, 8, 3, 2.5, 0.1))
    save_host(run_dir, tables.procs, tables.system)


def parent_growth(ticks: int) -> dict[str, object]:
    """The host sampler of doctor run's parent over ``ticks`` ticks of this process (a fake
    clock 0.5 s a tick, the real /proc reads): the Python memory it holds after each quarter,
    and what its tables would hold at their bound."""
    import os
    import tracemalloc

    from doctor.probes import host

    now = [0.0]
    sampler = host.HostSampler(os.getpid(), clock=lambda: now[0])
    tracemalloc.start()
    held = []
    for k in range(ticks):
        now[0] = k * 0.5
        sampler.sample()
        if (k + 1) % max(1, ticks // 4) == 0:
            held.append(tracemalloc.get_traced_memory()[0])
    tracemalloc.stop()
    from doctor.store.samples import PROC_COLUMNS, SYSTEM_COLUMNS

    per_tick = (held[-1] - held[0]) / max(1, ticks - ticks // 4) if len(held) > 1 else 0.0
    return {"parent_ticks": ticks, "parent_rows": len(sampler.tables.procs["t_s"]),
            "parent_held_kb_by_quarter": [round(h / 1024) for h in held],
            "parent_bytes_per_tick": round(per_tick),
            "parent_tables_bound_mb": round(host.MAX_ROWS * 8 * (len(PROC_COLUMNS)
                                                                 + len(SYSTEM_COLUMNS)) / 2**20,
                                            1)}


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def disk(run_dir: Path) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for path in run_dir.rglob("*"):
        if path.is_file():
            key = path.name if path.parent == run_dir else f"rings/{path.name}"
            sizes[key] = sizes.get(key, 0) + path.stat().st_size
    return dict(sorted(sizes.items(), key=lambda kv: -kv[1]))


class Stage:
    """Wall and CPU seconds of a stage (the CPU figure is steadier on a shared machine)."""

    def __init__(self, figures: dict[str, object], name: str) -> None:
        self.figures, self.name = figures, name

    def __enter__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def __exit__(self, *_exc: object) -> None:
        self.figures[f"{self.name}_s"] = round(time.perf_counter() - self.wall, 2)
        self.figures[f"{self.name}_cpu_s"] = round(time.process_time() - self.cpu, 2)
        self.figures[f"{self.name}_peak_mb"] = round(peak_mb())


def report(run_dir: Path, profile: bool) -> dict[str, object]:
    """Time each stage of doctor report on ``run_dir``, as finalize_run runs them."""
    from doctor.analyse.timeline import run_timeline
    from doctor.pipeline import analyse
    from doctor.reports.html import render_html
    from doctor.reports.json import render_json
    from doctor.reports.timeline import write_timeline
    from doctor.store.reader import load_run

    figures: dict[str, object] = {}
    with Stage(figures, "load"):
        run = load_run(run_dir)
    with Stage(figures, "analyse"):
        if profile:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            analysis = prof.runcall(analyse, run)
            pstats.Stats(prof).sort_stats("tottime").print_stats(30)
        else:
            analysis = analyse(run)
    ledger = analysis.ledger
    figures["ledger_steps"] = len(ledger)
    figures["verdict_steps"] = analysis.verdict.steps
    with Stage(figures, "timeline"):
        timeline = write_timeline(run_timeline(run, ledger), analysis.source,
                                  run_dir / "timeline.json.gz")
    with Stage(figures, "html"):
        html = render_html(analysis, timeline=timeline.name)
        (run_dir / "report.html").write_text(html)
        (run_dir / "verdict.json").write_text(render_json(analysis))
    figures["findings"] = [f.id for f in analysis.verdict.findings]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--rate", type=float, default=20.0, help="steps a second")
    parser.add_argument("--eval-every", type=int, default=2000)
    parser.add_argument("--eval-batches", type=int, default=50)
    parser.add_argument("--ckpt-every", type=int, default=20_000)
    parser.add_argument("--epoch-steps", type=int, default=50_000)
    parser.add_argument("--gc-every", type=int, default=5_000)
    parser.add_argument("--stalls", type=int, default=3)
    parser.add_argument("--capacity", type=int,
                        help="records per ring (default doctor's own): a ring that holds every "
                             "step times the analysis of a ledger of a million steps")
    parser.add_argument("--keep", type=Path, help="write the run here and keep it")
    parser.add_argument("--parent-ticks", type=int, default=0,
                        help="also run the parent's host sampler this many ticks (this process)")
    parser.add_argument("--profile", action="store_true", help="cProfile the analysis")
    parser.add_argument("--report-only", type=Path, metavar="RUN_DIR",
                        help="only time doctor report on a run directory written before")
    args = parser.parse_args()
    if args.report_only:
        print(json.dumps(report(args.report_only, args.profile), indent=1))
        return
    run_dir = args.keep or Path(tempfile.mkdtemp(prefix="doctor-long-")) / "run"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    if args.capacity:
        import doctor.record.session

        doctor.record.session.RING_CAPACITY = args.capacity
    t = time.perf_counter()
    steps = synthesise(run_dir, args.hours, args.rate, args)
    figures: dict[str, object] = {"hours": args.hours, "steps": steps,
                                  "synthesise_s": round(time.perf_counter() - t, 1),
                                  "synthesise_peak_mb": round(peak_mb())}
    figures["recorded_bytes"] = disk(run_dir)
    figures.update(report(run_dir, args.profile))
    written = disk(run_dir)
    figures["written_bytes"] = {k: written[k] for k in ("timeline.json.gz", "report.html",
                                                        "verdict.json") if k in written}
    if args.parent_ticks:
        figures.update(parent_growth(args.parent_ticks))
    print(json.dumps(figures, indent=1))
    if args.keep is None:
        shutil.rmtree(run_dir.parent)


if __name__ == "__main__":
    main()
