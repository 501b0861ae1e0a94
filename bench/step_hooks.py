"""What each job-side probe adds to a training step, in CPU time of the training thread.

    python bench/step_hooks.py                    # 40 rounds of 100-step blocks
    python bench/step_hooks.py --rounds 80 --after-window

A tiny model (so that doctor's hooks are a visible part of a step: a step of ~100-300 us) trains
through a DataLoader, ``zero_grad``, ``backward`` and ``optimizer.step`` in this one process, in
blocks of ``--steps`` steps, each block under one configuration:

* ``bare``: no doctor at all;
* ``all``: every job-side probe, as under ``doctor run`` (started for the block, closed after it
  with its patches undone);
* ``all - NAME``: every probe but NAME, turned off with ``DOCTOR_PROBES_OFF`` (the registry's
  bench knob, doctor.probes), so that ``all`` minus it is what NAME costs a step.

A block's figure is the CPU time of the training thread (``time.thread_time_ns``: other work on
the machine shows far less than in wall-clock time) per step; the configurations alternate for
``--rounds`` rounds and each keeps its smallest block (the least disturbed). By default the
profiler window never opens (the always-on cost); ``--after-window`` opens it at step 8 of each
block for 5 steps and times the steps after it (what the window leaves behind). The figures are
differences of a few microseconds: read them against the spread between rounds, and on a busy
machine run more rounds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from doctor.probes import ENV_PROBES_OFF

JOB_PROBES = ("steps", "dataloader", "page_faults", "torch_ops", "memory", "model_state", "ddp")


def loop() -> Callable[[int], int]:
    """A tiny training loop: ``run(n)`` trains n steps and returns their CPU ns."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # an epoch of 8192 steps: a new iterator (its settings read once) is rare, as in a real job
    data = TensorDataset(torch.randn(65536, 8), torch.randint(0, 2, (65536,)))
    loader = DataLoader(data, batch_size=8, shuffle=False)

    def run(n: int) -> int:
        done, t0 = 0, time.thread_time_ns()
        while done < n:
            for x, y in loader:
                loss = nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                done += 1
                if done >= n:
                    break
        return time.thread_time_ns() - t0

    return run


def block_ns(run: Callable[[int], int], config: str, steps: int, after_window: bool) -> float:
    """Mean CPU ns of a step over ``steps`` steps of ``config`` (probes started for the block
    and closed after it, with their patches undone)."""
    if config == "bare":
        run(20)  # as the others do
        return run(steps) / steps
    from doctor.record.bootstrap import start_session

    os.environ.pop(ENV_PROBES_OFF, None)
    if config.startswith("all - "):
        os.environ[ENV_PROBES_OFF] = config.removeprefix("all - ")
    tmp = tempfile.mkdtemp(prefix="doctor-hooks-")
    start = 8 if after_window else 10**9
    probes = start_session(Path(tmp), window_start=start, window_steps=5)
    try:
        # untimed: the process folder and its rings are made on the first record (once a run;
        # the window opens at step 8 and closes at step 13 of these where it is asked for)
        run(20)
        return run(steps) / steps
    finally:
        probes.close()
        os.environ.pop(ENV_PROBES_OFF, None)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100, help="steps a block")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--after-window", action="store_true",
                    help="open the window at step 8 and time the steps after it")
    args = ap.parse_args()
    configs = ["bare", "all", *(f"all - {p}" for p in JOB_PROBES)]
    run = loop()
    run(200)  # warm-up: lazy imports, the allocator's first growth
    best: dict[str, float] = {}
    for r in range(args.rounds):
        for config in configs:
            ns = block_ns(run, config, args.steps, args.after_window)
            best[config] = min(best.get(config, float("inf")), ns)
        if (r + 1) % 10 == 0:
            print(f"  round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    when = "after the window" if args.after_window else "window never opens"
    print(f"load average {os.getloadavg()[0]:.2f}; CPU us per step of the training thread "
          f"(smallest block of {args.rounds} rounds), {when}")
    bare, whole = best["bare"], best["all"]
    print(f"  {'bare':<22} {bare / 1e3:8.1f}")
    print(f"  {'all probes':<22} {whole / 1e3:8.1f}   doctor adds {(whole - bare) / 1e3:6.1f} us "
          f"({whole / bare:.3f}x)")
    for p in JOB_PROBES:
        ns = best[f"all - {p}"]
        print(f"  {'all - ' + p:<22} {ns / 1e3:8.1f}   {p} costs {(whole - ns) / 1e3:6.1f} us")


if __name__ == "__main__":
    main()
