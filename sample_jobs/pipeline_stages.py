"""A pipeline-parallel job (``torch.distributed.pipelining``, gloo, CPU) whose stages idle: each
rank holds one stage of a stack of linear layers, and a GPipe schedule runs each batch as a few
micro-batches, all forwards, then all backwards. With p stages and m micro-batches each stage
idles (p-1)/(m+p-1) of the step waiting for its neighbour (the bubble): 1/3 for 2 stages and 2
micro-batches.

Run it under torchrun: ``torchrun --nproc-per-node 2 sample_jobs/pipeline_stages.py``.

Switches: ``--microbatches M`` splits each batch into M micro-batches (more: a smaller bubble);
``--schedule 1f1b`` runs Schedule1F1B instead of GPipe; ``--unbalance F`` gives the last stage F
times the layers of the others (the other stages wait for it). ``--ablate N`` times the job and
the job with ``--switch-microbatches M2`` in one process, in alternating blocks of N steps.
``--stage-compute sleep`` makes each stage's compute device-like: each layer does a tiny real op
(a scale by a learned vector) and then sleeps ``--row-us`` microseconds a row of its micro-batch
in forward and twice that in backward, off the CPU as a GPU stage's thread is while its kernels
run; the stages then overlap on any number of cores, and their compute a step does not depend on
how the batch is split (no per-call cost of the host's matrix products), so the bubble's model
can be checked on a small machine. The default, ``cpu``, computes real linear layers on the CPU.

The job times its own stage: its forward and backward of each micro-batch and its optimizer
step (the stage's compute); the rest of its step is what it waited for its neighbours and for
the sends and receives. Rank 0 prints each rank's idle share of the step beside the theory.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _ddp import start_gloo
from _timing import plan

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


class ScaleThenSleep(torch.autograd.Function):
    """x * w, then a sleep of ``row_s`` a row (forward) or twice that (backward)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, row_s: float) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.row_s = row_s
        time.sleep(row_s * x.shape[0])
        return x * w

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, w = ctx.saved_tensors
        time.sleep(2 * ctx.row_s * x.shape[0])
        return grad * w, (grad * x).sum(0), None


class DeviceLikeLayer(nn.Module):
    """A layer whose compute is device-like: a tiny real op, then time off the CPU in
    proportion to the micro-batch's rows."""

    def __init__(self, width: int, row_s: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.row_s = row_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ScaleThenSleep.apply(x, self.weight, self.row_s)


def stage_module(kind: str, layers: int, width: int, row_s: float) -> nn.Module:
    if kind == "sleep":
        return nn.Sequential(*[DeviceLikeLayer(width, row_s) for _ in range(layers)])
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU())
                           for _ in range(layers)])


class ComputeClock:
    """The seconds this rank spends in its own stage's compute, step by step."""

    def __init__(self) -> None:
        self.busy = 0.0

    def timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.busy += time.perf_counter() - t0

        return run

    def take(self) -> float:
        busy, self.busy = self.busy, 0.0
        return busy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--layers", type=int, default=2, help="linear layers a stage")
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=256,
                    help="samples a step (split in micro-batches)")
    ap.add_argument("--microbatches", type=int, default=2)
    ap.add_argument("--schedule", choices=sorted(SCHEDULES), default="gpipe")
    ap.add_argument("--unbalance", type=float, default=1.0,
                    help="the last stage holds this many times the layers of the others")
    ap.add_argument("--ablate", type=int, default=0,
                    help="alternate blocks of N steps with --microbatches and "
                         "--switch-microbatches")
    ap.add_argument("--switch-microbatches", type=int, default=4)
    ap.add_argument("--stage-compute", choices=("cpu", "sleep"), default="cpu",
                    help="sleep: each layer sleeps --row-us a row (device-like compute)")
    ap.add_argument("--row-us", type=float, default=25.0,
                    help="with --stage-compute sleep: a layer's forward time a row (us)")
    args = ap.parse_args()
    rank = start_gloo()
    world = dist.get_world_size()
    last = rank == world - 1
    layers = max(1, round(args.layers * args.unbalance)) if last else args.layers
    module = stage_module(args.stage_compute, layers, args.width, args.row_us * 1e-6)
    clock = ComputeClock()
    sides = {False: args.microbatches, True: args.switch_microbatches}
    schedules = {}
    for side, m in sides.items():
        if side and args.ablate <= 0:
            break
        stage = PipelineStage(module, rank, world, torch.device("cpu"))
        stage.forward_one_chunk = clock.timed(stage.forward_one_chunk)  # type: ignore[method-assign]
        stage.backward_one_chunk = clock.timed(stage.backward_one_chunk)  # type: ignore[method-assign]
        schedules[side] = SCHEDULES[args.schedule](stage, n_microbatches=m,
                                                   loss_fn=nn.functional.mse_loss)
    opt = torch.optim.SGD(module.parameters(), lr=0.01)
    step_opt = clock.timed(opt.step)
    gen = torch.Generator().manual_seed(0)
    data = [(torch.randn(args.batch, args.width, generator=gen),
             torch.randn(args.batch, args.width, generator=gen)) for _ in range(4)]
    timer, blocks = plan(args.steps, args.ablate, False)
    idle: dict[bool, list[float]] = {False: [], True: []}
    step = 0
    for side, length in blocks:
        timer.start_block(side)
        for i in range(length):
            t0 = time.perf_counter()
            x, y = data[step % len(data)]
            opt.zero_grad()
            if rank == 0:
                schedules[side].step(x)
            elif last:
                schedules[side].step(target=y, losses=[])
            else:
                schedules[side].step()
            step_opt()
            timer.step()
            took = time.perf_counter() - t0
            if i >= 3:  # as the timer: a block's first steps are warm-up
                idle[side].append(1.0 - clock.take() / took)
            else:
                clock.take()
            step += 1
    shares: list[dict[bool, float | None]] = [{}] * world
    dist.all_gather_object(shares, {s: statistics.median(v) if v else None
                                    for s, v in idle.items()})
    if rank == 0:
        p = world
        theory = {s: (p - 1) / (m + p - 1) for s, m in sides.items()}
        print(json.dumps({"settings": {"schedule": args.schedule, "stages": p,
                                       "microbatches": args.microbatches,
                                       "unbalance": args.unbalance,
                                       "stage_compute": args.stage_compute}}), flush=True)
        timer.report(job="pipeline_stages", world_size=world,
                     idle_share_by_rank=[s[False] for s in shares],
                     bubble_theory=theory[False],
                     **({"switched_idle_share_by_rank": [s[True] for s in shares],
                         "switched_bubble_theory": theory[True],
                         "switch_microbatches": args.switch_microbatches}
                        if args.ablate > 0 else {}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
