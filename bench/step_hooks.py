"""What each job-side probe adds to a training step, in CPU time of the training thread.

    python bench/step_hooks.py                    # 3 rounds, 4000 steps a configuration
    python bench/step_hooks.py --rounds 5 --steps 8000 --after-window

A tiny model (so that doctor's hooks are a visible part of a step: a step of ~100-200 us) trains
for ``--steps`` steps through a DataLoader, ``zero_grad``, ``backward`` and ``optimizer.step``,
in a fresh process per configuration:

* ``bare``: no doctor at all;
* ``all``: every job-side probe, as under ``doctor run``;
* ``all - NAME``: every probe but NAME, turned off with ``DOCTOR_PROBES_OFF`` (the registry's
  bench knob, doctor.probes), so that ``all`` minus it is what NAME costs a step.

Each step is timed with ``time.thread_time_ns`` (CPU time of the training thread: other work on
the machine barely shows, unlike wall-clock time); a configuration's figure is the mean over the
steps of its least disturbed block of ``BLOCK`` steps (other work on the machine still slows
some blocks down), and over ``--rounds`` rounds (configurations alternating) the smallest. By
default the profiler window never opens (the always-on cost); ``--after-window`` opens it at
step 8 for 5 steps and times only the steps after it (what the window leaves behind).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BLOCK = 50  # steps a block: a configuration's figure is its least disturbed block's mean
JOB_PROBES = ("steps", "dataloader", "torch_ops", "memory", "model_state", "ddp")


def child(steps: int, doctor: bool, after_window: bool) -> None:
    """Runs in the measuring process: train, print the steps' CPU times (ns) as JSON."""
    import time

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    skip = 0
    if doctor:
        from doctor.record.bootstrap import start_session

        start, window = (8, 5) if after_window else (10**9, 5)
        skip = 20 if after_window else 0
        probes = start_session(Path(tempfile.mkdtemp(prefix="doctor-hooks-")),
                               window_start=start, window_steps=window)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(512, 8), torch.randint(0, 2, (512,)))
    loader = DataLoader(data, batch_size=8, shuffle=False)
    times: list[int] = []
    last = time.thread_time_ns()
    while len(times) < steps + skip:
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            now = time.thread_time_ns()
            times.append(now - last)
            last = now
            if len(times) >= steps + skip:
                break
    if doctor:
        probes.close()
    print(json.dumps(times[skip + steps // 10:]))


def measure(steps: int, config: str, after_window: bool) -> float:
    """Mean CPU ns of a step in one fresh process of ``config``."""
    env = {k: v for k, v in os.environ.items() if k != "DOCTOR_PROBES_OFF"}
    if config.startswith("all - "):
        env["DOCTOR_PROBES_OFF"] = config.removeprefix("all - ")
    cmd = [sys.executable, __file__, "--child", "--steps", str(steps)]
    if config != "bare":
        cmd.append("--doctor")
    if after_window:
        cmd.append("--after-window")
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    times = json.loads(out.stdout.strip().splitlines()[-1])
    blocks = [statistics.fmean(times[i:i + BLOCK]) for i in range(0, len(times) - BLOCK + 1, BLOCK)]
    return min(blocks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--after-window", action="store_true",
                    help="open the window at step 8 and time the steps after it")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--doctor", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.steps, args.doctor, args.after_window)
        return
    configs = ["bare", "all", *(f"all - {p}" for p in JOB_PROBES)]
    best: dict[str, float] = {}
    for r in range(args.rounds):
        for config in configs:
            ns = measure(args.steps, config, args.after_window)
            best[config] = min(best.get(config, float("inf")), ns)
        print(f"  round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    when = "after the window" if args.after_window else "window never opens"
    print(f"load average {os.getloadavg()[0]:.2f}; CPU us per step of the training thread "
          f"(smallest mean of {args.rounds}), {when}")
    bare, whole = best["bare"], best["all"]
    print(f"  {'bare':<22} {bare / 1e3:8.1f}")
    print(f"  {'all probes':<22} {whole / 1e3:8.1f}   doctor adds {(whole - bare) / 1e3:6.1f} us "
          f"({whole / bare:.3f}x)")
    for p in JOB_PROBES:
        ns = best[f"all - {p}"]
        print(f"  {'all - ' + p:<22} {ns / 1e3:8.1f}   {p} costs {(whole - ns) / 1e3:6.1f} us")


if __name__ == "__main__":
    main()
