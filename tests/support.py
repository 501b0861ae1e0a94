"""What the tests share: where things are, fake clocks, the doctor CLI as a user runs it, and
small builders of recorded data (a training loop recorded through a real Session, run records,
node folders, evidence for the rules, a step frame, a fake torch for the memory probe).

Test modules import from here and from the named support modules beside it (fake_nvml,
chrome_trace, trace_files, reference_collector, browser), never from another test module.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Hashable, Mapping
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import numpy as np
import pandas as pd
import pytest

from doctor.analyse.comm_model import bucket_what_ifs, no_sync_what_if, rank_comm, scaling
from doctor.analyse.comms import CommModel
from doctor.analyse.evidence import Evidence
from doctor.analyse.reads import KIB
from doctor.analyse.split import InputSplit
from doctor.analyse.stages import JobFacts
from doctor.record.session import (
    EVENT_WINDOW_START,
    EVENT_WINDOW_STOP_BEGIN,
    EVENT_WINDOW_STOP_END,
    STEP_BACKWARD,
    STEP_DATALOADER,
    STEP_MANUAL,
    Session,
)
from doctor.store import layout
from doctor.store.records import LOSS_INF, scale_key
from doctor.store.rundir import write_node_record, write_run_record
from doctor.trace.steps import STEP_COLUMNS
from doctor.verdict import CATEGORIES

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_JOBS = ROOT / "sample_jobs"
#: Recorded traces committed with the tests (tests/data/traces/README.md says what each is).
DATA_TRACES = ROOT / "tests" / "data" / "traces"
#: The real GPU traces beside the checkout (../shared/traces): not committed; tests skip without.
SHARED_TRACES = ROOT.parent / "shared" / "traces"

K = TypeVar("K", bound=Hashable)


# -- clocks -------------------------------------------------------------------------------------

class FakeClock:
    """A monotonic clock in ns that only moves when a test ticks it."""

    def __init__(self, start_ns: int = 10**12) -> None:
        self.now = start_ns

    def __call__(self) -> int:
        return self.now

    def tick(self, seconds: float) -> int:
        self.now += round(seconds * 1e9)
        return self.now


class TickClock:
    """A clock in seconds (a float) that only moves when a test sets ``now``."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- the doctor CLI and the machine -------------------------------------------------------------

def doctor_cmd(*args: str, cwd: Path | None = None, timeout: float = 180,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the doctor CLI as a user would, capturing its output."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "doctor.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, env=full_env)


def run_together(commands: Mapping[K, list[str]], timeout: float = 240,
                 env: Mapping[K, dict[str, str]] | None = None
                 ) -> dict[K, subprocess.CompletedProcess[str]]:
    """Every command started at once (each with ``env[key]`` added to this one's environment),
    then each waited for (killed after ``timeout`` s from its wait): for jobs that mostly wait
    or import torch, side by side."""
    started = {key: subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env={**os.environ, **(env or {}).get(key, {})})
               for key, cmd in commands.items()}
    done = {}
    for key, proc in started.items():
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        done[key] = subprocess.CompletedProcess(commands[key], proc.returncode, out, err)
    return done


def run_sample_job(out: Path, script: str, *args: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``doctor run --out OUT -- python sample_jobs/SCRIPT ARGS`` on one thread: the job's own
    timing line (sample_jobs/_timing.py) and the verdict.json doctor wrote."""
    import json

    result = doctor_cmd("run", "--out", str(out), "--", sys.executable, str(SAMPLE_JOBS / script),
                        *args, timeout=300, env={"OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    [job] = [json.loads(line) for line in result.stdout.splitlines()
             if line.startswith('{"median_step_s"')]
    return job, json.loads((out / "verdict.json").read_text())


def parallel_cores() -> float:
    """How many of two busy processes the machine runs at once now (2.0: both, 1.0: one at a
    time): a shared VM's second core is sometimes not there."""
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c",
                               "import time\nc = time.process_time()\n"
                               "while time.process_time() - c < 0.3:\n    pass\n"])
             for _ in range(2)]
    for p in procs:
        p.wait()
    wall = time.perf_counter() - t0
    return min(2.0, 0.6 / max(wall - 0.05, 1e-3))  # 0.05 s: the two interpreters' start


def skip_if_the_cores_were_taken(what: str) -> None:
    """After a measurement that needed two cores came out short: skip, saying why, when the
    machine does not run two busy processes at once now either (the fixture two_cores looked
    before the measurement only: a shared VM's second core comes and goes); else return, and the
    test fails as it should."""
    got = parallel_cores()
    if got < 1.6:
        pytest.skip(f"{what}, and the machine runs two busy processes at {got:.1f}x one's speed "
                    "now, not 2x (a shared VM's second core taken during the measurement)")


# -- recorded run directories -------------------------------------------------------------------

def compiled_loop(run_dir: Path, steps: int, compiles: dict[int, tuple[float, int]],
                  step_s: float = 0.01, meta: dict | None = None) -> None:
    """A training loop; ``compiles`` maps a step (from 0) to the compilation in it: its seconds
    and its ring key (compile_key(frame, nth), or negative for a deferred one); ``meta``: what
    the process's meta also says (the compile probe's causes...)."""
    clock = FakeClock()
    s = Session(run_dir, clock=clock, window_start=10**9)
    for i in range(steps):
        if i in compiles:
            seconds, key = compiles[i]
            c0 = clock()
            clock.tick(seconds)
            s.record_interval("compile", c0, clock(), key)
        clock.tick(step_s * 0.5)
        b0 = clock()
        clock.tick(step_s * 0.4)
        s.record_interval("backward", b0, clock())
        s.count_step(STEP_BACKWARD)
        s.record_optimizer_start()
        clock.tick(step_s * 0.1)
        s.record_optimizer_end(0)
    if meta:
        s.update_meta(**meta)
    s.close()
    write_record(run_dir)



def record_loop(run_dir: Path, steps: int, *, wait_s: float = 0.0, compute_s: float = 0.01,
                optimizers: int = 1, use_optimizer: bool = True, manual: bool = False,
                slow_first: int = 0, rank: int = 0, loader: dict | None = None,
                clock: FakeClock | None = None,
                then: tuple[int, float, float] | None = None,
                meta: dict | None = None, windows: tuple[int, ...] = ()) -> Session:
    """A loop of ``steps`` iterations: wait for a batch, compute, step the optimizer(s); with
    ``then`` (steps, wait_s, compute_s), a second phase of the same loop follows; ``meta``: the
    process's facts (its framework, its optimizers...). ``windows``: the steps (from 0) at which
    a profiler window opens, for 5 steps and a 0.3 s export (its events only: no trace)."""
    clock = clock or FakeClock()
    session = Session(run_dir, rank=rank, clock=clock, window_start=10**9)
    if meta:
        session.update_meta(**meta)
    loader_id = session.record_loader(loader or {"num_workers": 0, "batch_size": 32,
                                                 "pin_memory": False,
                                                 "persistent_workers": False})
    phases = [(steps, wait_s, compute_s), *([then] if then else [])]
    plan = [(w, c) for n, w, c in phases for _ in range(n)]
    for i, (wait_s, compute_s) in enumerate(plan):
        slow = 10.0 if i < slow_first else 1.0
        if i in windows:
            session.record_event(EVENT_WINDOW_START, i)
        if i - 5 in windows:
            session.record_event(EVENT_WINDOW_STOP_BEGIN)
            clock.tick(0.3)
            session.record_event(EVENT_WINDOW_STOP_END)
        t0 = clock()
        clock.tick(wait_s * slow)
        session.record_interval("loader_wait", t0, clock(), loader_id)
        session.count_step(STEP_DATALOADER)
        clock.tick(compute_s * slow * 0.4)  # forward
        b0 = clock()
        clock.tick(compute_s * slow * 0.5)
        session.record_interval("backward", b0, clock())
        for k in range(optimizers):
            if use_optimizer:
                session.record_optimizer_start()
                clock.tick(compute_s * slow * 0.1 / optimizers)
                session.record_optimizer_end(k)
            else:
                clock.tick(compute_s * slow * 0.1 / optimizers)
        if manual:
            session.mark_step(STEP_MANUAL)
    session.close()
    return session


def scaled_loop(run_dir: Path, iterations: int, skip: set[int], micro_batches: int = 1,
                step_s: float = 0.03, *, scale: float | None = None,
                fused: bool = False, nonfinite: set[int] = frozenset(),  # type: ignore[assignment]
                growth_interval: int = 2000, autocast: tuple[str, str] | None = None,
                peaks: dict[str, Any] | None = None, meta: dict[str, Any] | None = None) -> None:
    """A loop under a GradScaler: ``skip`` holds the iterations (from 0) whose optimizer step
    the scaler skipped; each runs ``micro_batches`` backward() calls. With ``scale``, the
    scaler's scale is recorded as the probe does (its start, halved at each skip, doubled after
    ``growth_interval`` clean iterations) with its settings in the meta; ``fused``: the
    optimizer steps every iteration (it skips inside its kernel: only the scale says so);
    ``nonfinite``: the iterations whose losses were inf; ``autocast``: the (device, dtype) the
    process entered; ``peaks``: the machine's measured roofs (run.json); ``meta``: more of the
    process's meta.json (what the overflow watch read: doctor.probes.overflow_watch)."""
    clock = FakeClock()
    s = Session(run_dir, clock=clock, window_start=10**9)
    if meta:
        s.update_meta(**meta)
    if autocast is not None:
        s.update_meta(autocast=[{"device": autocast[0], "dtype": autocast[1], "enabled": True}])
    if scale is not None:
        s.update_meta(scalers=[{"class": "GradScaler", "device": "cpu", "enabled": True,
                                "init_scale": scale, "growth_factor": 2.0,
                                "backoff_factor": 0.5, "growth_interval": growth_interval}])
    clean = 0
    for i in range(iterations):
        for _ in range(micro_batches):
            s.count_step(STEP_DATALOADER)
            clock.tick(step_s * 0.4 / micro_batches)
            b0 = clock()
            clock.tick(step_s * 0.4 / micro_batches)
            s.record_interval("backward", b0, clock())
            if i in nonfinite:
                s.record_interval("nonfinite", b0, clock(), LOSS_INF)
            s.count_step(STEP_BACKWARD)
        stepped = i not in skip
        if stepped or fused:
            s.record_optimizer_start()
            clock.tick(step_s * 0.1)
            s.record_optimizer_end(0)
        u0 = clock()
        if scale is not None and i == 0:
            s.record_interval("scale", u0, u0, scale_key(scale))
        clock.tick(step_s * 0.1)
        s.record_interval("scaler", u0, clock(), 1 if stepped or fused else 0)
        if scale is not None:
            clean = 0 if not stepped else clean + 1
            scale = scale * 0.5 if not stepped else scale * 2 if clean == growth_interval \
                else scale
            clean = 0 if clean == growth_interval else clean
            s.record_interval("scale", clock(), clock(), scale_key(scale))
    s.close()
    write_record(run_dir, **({"peaks": peaks} if peaks else {}))


def write_record(run_dir: Path, exit_code: int | None = 0, cores: int = 2, **extra: object
                 ) -> None:
    write_run_record(run_dir, {"argv": ["python", "train.py"], "name": "train",
                               "t0_monotonic_s": 1000.0, "cores": cores,
                               "exit_code": exit_code, **extra})


def record_node(job_dir: Path, node: int, nnodes: int = 2, *, ended: bool = True,
                done: bool = True, t0_s: float = 1000.0) -> Path:
    """Node ``node``'s run directory with one recorded rank (its global rank is the node's)."""
    run_dir = layout.node_dir(job_dir, node)
    record_loop(run_dir, 30, compute_s=0.01, rank=node)
    write_record(run_dir, exit_code=0 if ended else None, t0_monotonic_s=t0_s)
    write_node_record(run_dir, node, nnodes, done=done)
    return run_dir


def fake_node(job_dir: Path, node: int, nnodes: int = 2, *, ended: bool = True,
              done: bool = True, t0_s: float = 1000.0) -> Path:
    """A node's run directory with a run record only (nothing recorded in it)."""
    run_dir = layout.node_dir(job_dir, node)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_record(run_dir, exit_code=0 if ended else None, t0_monotonic_s=t0_s)
    write_node_record(run_dir, node, nnodes, done=done)
    return run_dir


#: What the file of the user's that links are planted to (conftest's ``victim``) holds.
VICTIM_TEXT = "the user's own file\n"


def plant(folder: Path, names: list[str], victim: Path) -> None:
    """Each of ``names`` in ``folder`` made a symbolic link to ``victim``."""
    for name in names:
        path = folder / name
        if path.is_symlink() or path.is_file():
            path.unlink()
        path.symlink_to(victim)


def regular(path: Path) -> bool:
    """A regular file, not a link."""
    return stat.S_ISREG(os.lstat(path).st_mode)


# -- builders of analysis inputs --------------------------------------------------------------

JOB_FIELDS = {f.name for f in fields(JobFacts)}
EVIDENCE_FIELDS = {f.name for f in fields(Evidence)}


def evidence(*, split: dict[str, float] | None = None,
             top: dict[str, tuple[str, ...]] | None = None,
             collate_share: float | None = None, **facts: Any) -> Evidence:
    """Frames and Evidence fields as given; JobFacts fields (cores, device, ...) make the job;
    ``split`` (stage -> share of loading, with ``top`` and ``collate_share``) the InputSplit."""
    job = JobFacts(**{k: v for k, v in facts.items() if k in JOB_FIELDS})
    rest = {k: v for k, v in facts.items() if k not in JOB_FIELDS}
    unknown = set(rest) - EVIDENCE_FIELDS
    assert not unknown, f"not evidence: {unknown}"
    if split is not None:
        rest["input_split"] = InputSplit(stage_shares=split, top=top or {},
                                         collate_share_of_fetch=collate_share)
    return Evidence(job=job, **rest)


def ledger(n: int = 30, wait: float = 0.0, compute: float = 0.01, other: float = 0.0,
           spikes: int = 0) -> pd.DataFrame:
    rows = []
    for i in range(n):
        extra = 1.0 if i < spikes else 0.0
        row = dict.fromkeys(CATEGORIES, 0.0)
        row.update(preprocess=wait, compute=compute, other=other + extra)
        wall = wait + compute + other + extra
        rows.append({"rank": 0, "step": i + 1, "start_s": float(i), "wall_s": wall, **row,
                     "wait_s": wait, "backward_s": compute / 2, "optimizer_s": compute / 10,
                     "fetch_s": wait, "warmup": False, "analyzed": True})
    return pd.DataFrame(rows)


def loaders(**settings: object) -> pd.DataFrame:
    base = {"num_workers": 0, "batch_size": 32, "persistent_workers": False,
            "prefetch_factor": None, "pin_memory": False}
    base.update(settings)
    return pd.DataFrame([base])


def read_counters(read_kib: float, reads_per_s: float, from_storage: float, seconds: float = 10.0
         ) -> pd.DataFrame:
    """Two processes (the training process and a worker) sampled at 2 Hz, reading alike."""
    t = np.arange(0.0, seconds + 0.25, 0.5)
    rows = []
    for pid in (100, 101):
        calls = reads_per_s / 2 * t
        chars = calls * read_kib * KIB
        rows += [{"node": 0, "pid": pid, "t_s": a, "read_count": b, "read_chars": c,
                  "read_bytes": c * from_storage} for a, b, c in zip(t, calls, chars, strict=True)]
    return pd.DataFrame(rows)


def steps(n: int = 4, **values: Any) -> pd.DataFrame:
    """A step frame of ``n`` identical 100 ms GPU steps with a busy, healthy GPU by default."""
    row: dict[str, Any] = {c: 0 for c in STEP_COLUMNS}
    row.update({
        "boundary": "profiler_step", "device": "cuda", "dur_s": 0.1, "gpu_busy_s": 0.095,
        "kernel_s": 0.095, "kernel_count": 400, "kernel_median_us": 120.0, "launch_count": 400,
        "gpu_cc": 8.0, "gpu_name": "NVIDIA A100", "sync_source": "", "gpu_idle_s": 0.005,
        "excl_compute_s": 0.095, "excl_other_s": 0.005,
    })
    row.update(values)
    frame = pd.DataFrame([dict(row, step=i) for i in range(n)]).astype(STEP_COLUMNS)
    return frame


MIB = 1 << 20


class FakeCuda:
    """torch.cuda as the memory probe reads it: one 80 GiB GPU whose allocator ``stats`` a test
    changes."""

    def __init__(self) -> None:
        self.stats = {"allocated_bytes.all.current": 2000 * MIB,
                      "reserved_bytes.all.current": 6000 * MIB,
                      "inactive_split_bytes.all.current": 1500 * MIB,
                      "num_alloc_retries": 3, "num_ooms": 0,
                      "reserved_bytes.all.peak": 6500 * MIB}

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def current_device(self) -> int:
        return 0

    def memory_stats(self, device: int) -> dict[str, int]:
        return dict(self.stats)

    def get_device_properties(self, device: int) -> Any:
        return SimpleNamespace(total_memory=80 * 1024 * MIB)


def fake_torch(cuda: Any = None) -> Any:
    """A torch of only what the memory probe calls; ``observers`` holds the OOM observers it
    attached."""
    observers: list[Any] = []
    return SimpleNamespace(
        cuda=cuda or FakeCuda(), version=SimpleNamespace(cuda="12.4"),
        _C=SimpleNamespace(_cuda_attach_out_of_memory_observer=observers.append),
        observers=observers)


# -- the communication model: its collectives, DDP's buckets, the steps ----------------------

def comm_calls(sizes: list[float], seconds: list[float], bound: str = "bandwidth",
               steps_n: int = 1) -> pd.DataFrame:
    """All-reduces of the given sizes and times (each ``steps_n`` times)."""
    rows = [{"kind": "allreduce", "bytes": b, "seconds": s, "bound": bound, "waiting_s": 0.0,
             "pid": 1, "on_gpu": True} for _ in range(steps_n)
            for b, s in zip(sizes, seconds, strict=True)]
    return pd.DataFrame(rows)


def ddp_buckets(**values: Any) -> pd.DataFrame:
    """DDP's buckets as the probe records them: 25 MiB by default."""
    row = {"pid": 1, "bucket_cap_bytes": 25 * MIB, "last_bucket_bytes": None, "dtypes": "float",
           "backward_compute_s": None}
    row.update(values)
    return pd.DataFrame([row])


def comm_window(step: float, comm: float, exposed: float, n: int = 1) -> pd.DataFrame:
    """``n`` steps of ``step`` s with ``comm`` s of communication, ``exposed`` s of it exposed."""
    return pd.DataFrame({"rank": [0] * n, "dur_s": [step] * n, "comm_s": [comm] * n,
                         "comm_exposed_s": [exposed] * n})


def comm_model(step: float = 0.2, comm: float = 0.1, exposed: float = 0.1) -> CommModel:
    """Rank 0's communication model of 2 ranks, 128 MiB buckets, with its what-ifs."""
    m = rank_comm(0, 2, comm_window(step, comm, exposed), comm_calls([100 * MIB], [comm]),
                  ddp_buckets(bucket_cap_bytes=128 * MIB, backward_compute_s=0.08))
    assert m is not None
    return CommModel(m, (*bucket_what_ifs(m), no_sync_what_if(m)), tuple(scaling(m)))


#: A tiny training job: it appends a line to the file its first argument names, then trains.
MARKER_JOB = textwrap.dedent("""
    import sys
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    open(sys.argv[1], "a").write("ran\\n")  # the marker: the job started
    model = torch.nn.Linear(32, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(640, 32), torch.randint(0, 4, (640,)))
    for x, y in DataLoader(data, batch_size=32):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
""")


# -- data the two halves of a split module both use ------------------------------------------

#: Values that must never be written nor shown.
SECRETS = [f"SEKRIT{n}xyz" for n in range(10)]


ENV = {"HF_TOKEN": SECRETS[6], "MASTER_ADDR": f"me:{SECRETS[7]}@127.0.0.1",
       "TORCH_HUB_TOKEN": SECRETS[8], "NCCL_SOCKET_PASSWORD": SECRETS[9]}


#: What py-spy says when ptrace lets it attach but not suspend the process.
PY_SPY_SUSPEND_ERROR = """\
Error: Failed to suspend process

Caused by:
    Operation not permitted (os error 1)

Stack backtrace:
   0: py_spy::python_spy::PythonSpy::get_stack_traces
             at src/python_spy.rs:212:9
   1: std::rt::lang_start_internal
"""


#: The main process's stack while it fetches a batch in its own DataLoader.
LOADER_MAIN_STACK = ("<module> (train.py:80)", "main (train.py:67)",
        "__next__ (probes/dataloader.py:72)",
        "_BaseDataLoaderIter.__next__ (torch/utils/data/dataloader.py:725)",
        "_SingleProcessDataLoaderIter._next_data (torch/utils/data/dataloader.py:785)",
        "fetch (probes/dataloader.py:115)",
        "_MapDatasetFetcher.fetch (torch/utils/data/_utils/fetch.py:52)")


def write_module(folder: Path, name: str = "m", text: str = "X = 1\n") -> Path:
    """A module ``name``.py of ``text`` in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / f"{name}.py"
    source.write_text(text)
    return source


def run_then_try(tmp_path: Path, command: list[str], *try_args: str,
                 env: dict[str, str] | None = None) -> tuple[Path, dict[str, Any]]:
    """``doctor run`` of ``command`` into TMP/run (unless a test ran it there already), then
    ``doctor try`` of it with ``try_args``: the run directory and the try's record."""
    run_dir = tmp_path / "run"
    if not run_dir.exists():
        ran = doctor_cmd("run", "--out", str(run_dir), "--", *command, cwd=tmp_path,
                         timeout=240, env=env)
        assert ran.returncode == 0, ran.stderr[-3000:]
    tried = doctor_cmd("try", str(run_dir), "--yes", *try_args, cwd=tmp_path, timeout=400,
                       env=env)
    assert tried.returncode == 0, tried.stderr[-3000:] + tried.stdout[-2000:]
    [record_path] = sorted(run_dir.glob("tries/*/try.json"))[-1:]
    return run_dir, dict(json.loads(record_path.read_text()))


def settings_seen(attempt: Path) -> dict[str, Any]:
    """What the job printed it runs with (its own view, not doctor's record)."""
    for line in (attempt / "stdout.txt").read_text().splitlines():
        if line.startswith('{"settings"'):
            return dict(json.loads(line)["settings"])
    raise AssertionError(f"the job printed no settings in {attempt}")
