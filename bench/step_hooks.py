"""What each job-side probe adds to a training step, in CPU time of the training thread.

    python bench/step_hooks.py                    # the hook path alone, 40 rounds
    python bench/step_hooks.py --loop             # whole steps of a tiny training loop
    python bench/step_hooks.py --after-window     # the loop's steps after the window
    python bench/step_hooks.py --hooks-after-window   # the hook path after the window: with
                                                  # the drift detector (DOCTOR_REWINDOW=off: none)
    python bench/step_hooks.py --amp              # with bf16 autocast and a GradScaler

By default, one step's hook path alone: the DataLoader's ``__next__``, the fetch and the collate,
``backward()`` and the optimizer's global step hooks, each called once around a stand-in that does
nothing, so that what is timed is the probes' own work (and the stand-ins', the ``bare`` line).
With ``--loop``, whole steps of a tiny model (a step of ~100-300 us) through a DataLoader,
``zero_grad``, ``backward`` and ``optimizer.step``: the probes' cost with torch's around it,
noisier. With ``--amp``, each step also enters a bf16 autocast and updates a CPU GradScaler
(the steps probe notes the autocast, reads the scale and the loss: probes/amp.py); the
hook path's update is a stand-in, its scale a real CPU tensor. Either runs in this one
process, in blocks of ``--steps`` steps, each block under one
configuration:

* ``bare``: no doctor at all;
* ``all``: every job-side probe, as under ``doctor run`` (started for the block, closed after it
  with its patches undone);
* ``all - NAME``: every probe but NAME, turned off with ``DOCTOR_PROBES_OFF`` (the registry's
  bench knob, doctor.probes), so that ``all`` minus it is what NAME costs a step.

A block's figure is the CPU time of the training thread (``time.thread_time_ns``) per step; the
configurations alternate for ``--rounds`` rounds and each keeps its smallest block (the least
disturbed). The profiler window never opens, except with ``--after-window`` (at step 8 of each
block, for 5 steps; the steps after it are timed: what the window leaves behind), or with
``--hooks-after-window`` (the hook path alone, the window opened and closed in the untimed
steps: the timed ones carry the drift detector that follows the step after the first window,
doctor.record.drift; ``all - torch_ops`` is without it). The figures are
differences of a few microseconds: read them against the spread between rounds (about 0.3 us for
the hook path on a busy 2-core machine, tens of us for the loop).
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

JOB_PROBES = ("steps", "dataloader", "page_faults", "torch_ops", "memory", "model_state", "ddp",
              "gc")


def loop(amp: bool = False) -> Callable[[int], int]:
    """A tiny training loop: ``run(n)`` trains n steps and returns their CPU ns (``amp``: under
    bf16 autocast and a GradScaler)."""
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
    scaler = torch.amp.GradScaler("cpu", enabled=amp)

    def run(n: int) -> int:
        done, t0 = 0, time.thread_time_ns()
        while done < n:
            for x, y in loader:
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                    loss = nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                done += 1
                if done >= n:
                    break
        return time.thread_time_ns() - t0

    return run


def hook_path(amp: bool = False) -> Callable[[int], int]:
    """One step's hook path alone: the DataLoader's ``__next__``, the fetch and the collate,
    ``backward()`` (of a one-element loss) and the optimizer's global step hooks, each around a
    stand-in that does nothing (installed before the probes, so that they wrap it); with
    ``amp``, a bf16 autocast entered and a GradScaler's ``update`` (a stand-in). ``run(n)``
    makes n such steps and returns their CPU ns: the calls are the probes' and the stand-ins'
    only, so other work on the machine shows far less than in a training step."""
    import torch
    from torch.optim import optimizer as optim
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data import dataloader as dl
    from torch.utils.data._utils import fetch

    batch = (torch.zeros(2), torch.zeros(2))
    fakes = {
        (dl._BaseDataLoaderIter, "__next__"): lambda self: batch,
        (fetch._MapDatasetFetcher, "fetch"): lambda self, index: batch,
    }
    for (owner, name), fake in fakes.items():
        setattr(owner, name, fake)
    torch.autograd.backward = lambda *args, **kwargs: None
    torch.amp.GradScaler.update = lambda self, new_scale=None: None  # type: ignore[method-assign]
    loader = DataLoader(TensorDataset(torch.zeros(8, 2)), batch_size=2)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    loss = torch.zeros((), requires_grad=True)
    scaler = torch.amp.GradScaler("cpu")
    scaler._scale = torch.full((), 1024.0)
    cast = torch.autocast("cpu", dtype=torch.bfloat16)

    def run(n: int) -> int:
        it = iter(loader)  # the probes' wrappers of this moment
        fetcher = fetch._MapDatasetFetcher(loader.dataset, True, lambda b: b, False)
        nxt, fetch_one, collate = type(it).__next__, type(fetcher).fetch, fetcher.collate_fn
        backward = torch.autograd.backward
        update = type(scaler).update
        pre = list(optim._global_optimizer_pre_hooks.values())
        post = list(optim._global_optimizer_post_hooks.values())
        t0 = time.thread_time_ns()
        for _ in range(n):
            nxt(it)
            fetch_one(fetcher, [0, 1])
            collate(batch)
            if amp:
                with cast:
                    pass
            backward(loss)
            for hook in pre:
                hook(opt, (), {})
            for hook in post:
                hook(opt, (), {})
            if amp:
                update(scaler)
        return time.thread_time_ns() - t0

    return run


def block_ns(run: Callable[[int], int], config: str, steps: int, after_window: bool) -> float:
    """Mean CPU ns of a step over ``steps`` steps of ``config`` (probes started for the block
    and closed after it, with their patches undone)."""
    if config == "bare":
        run(20)  # as the others do
        return run(steps) / steps
    from doctor.bootstrap import start_session
    from doctor.record.window import Window

    os.environ.pop(ENV_PROBES_OFF, None)
    if config.startswith("all - "):
        os.environ[ENV_PROBES_OFF] = config.removeprefix("all - ")
    tmp = tempfile.mkdtemp(prefix="doctor-hooks-")
    start = 8 if after_window else 10**9
    probes = start_session(Path(tmp), window=Window(start, 5))
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
    ap.add_argument("--steps", type=int, default=0,
                    help="steps a block (default: 2000 for the hook path, 100 for the loop)")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--loop", action="store_true",
                    help="time whole steps of a tiny training loop instead of the hook path "
                         "alone (the probes' cost and torch's, so noisier)")
    ap.add_argument("--after-window", action="store_true",
                    help="open the window at step 8 and time the steps after it")
    ap.add_argument("--hooks-after-window", action="store_true",
                    help="the hook path alone, timed after the window (the drift detector on)")
    ap.add_argument("--amp", action="store_true",
                    help="each step under bf16 autocast with a GradScaler update")
    args = ap.parse_args()
    configs = ["bare", "all", *(f"all - {p}" for p in JOB_PROBES)]
    whole_steps = args.loop or args.after_window
    args.steps = args.steps or (100 if whole_steps else 2000)
    run = loop(args.amp) if whole_steps else hook_path(args.amp)
    run(200)  # warm-up: lazy imports, the allocator's first growth
    best: dict[str, float] = {}
    for r in range(args.rounds):
        for config in configs:
            ns = block_ns(run, config, args.steps, args.after_window or args.hooks_after_window)
            best[config] = min(best.get(config, float("inf")), ns)
        if (r + 1) % 10 == 0:
            print(f"  round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    when = ("after the window" if args.after_window or args.hooks_after_window
            else "window never opens") + (
        ", whole steps of a tiny loop" if args.loop or args.after_window else
        ", the hook path of a step alone") + (", bf16 autocast and a GradScaler" if args.amp
                                               else "")
    print(f"load average {os.getloadavg()[0]:.2f}; CPU us per step of the training thread "
          f"(smallest block of {args.rounds} rounds), {when}")
    bare, whole = best["bare"], best["all"]
    print(f"  {'bare':<22} {bare / 1e3:8.1f}")
    ratio = f" ({whole / bare:.3f}x)" if args.loop or args.after_window else ""
    print(f"  {'all probes':<22} {whole / 1e3:8.1f}   doctor adds {(whole - bare) / 1e3:6.1f} us"
          + ratio)
    for p in JOB_PROBES:
        ns = best[f"all - {p}"]
        print(f"  {'all - ' + p:<22} {ns / 1e3:8.1f}   {p} costs {(whole - ns) / 1e3:6.1f} us")


if __name__ == "__main__":
    main()
