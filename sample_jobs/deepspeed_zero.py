"""A DeepSpeed ZeRO job (gloo, CPU) whose step time goes to ZeRO's collectives: a stack of wide
linear layers trained by a DeepSpeed engine on a per-rank batch so small that the work is little
beside what ZeRO moves: at stage 3, the parameters all-gathered before forward (and the small
ones, kept whole on every rank, gathered one call each after every step), the gradients
reduce-scattered after backward; at stages 1 and 2, the gradients reduced and the updated
parameters all-gathered after the optimizer's step. It needs DeepSpeed (``pip install
deepspeed``), which doctor does not.

Run it under torchrun: ``torchrun --nproc-per-node 2 sample_jobs/deepspeed_zero.py --stage 3``.

Switches: ``--stage S`` is the job's ZeRO stage (0-3); ``--switch-stage S`` trains the switched
side at stage S instead (``--switch-stage 2`` from stage 3: the parameters stay whole on every
rank, for their memory, and the gathers before forward are gone); ``--switch-threshold N`` sets
the switched side's ``stage3_param_persistence_threshold`` (0: no parameter is kept whole, the
small ones are gathered with the large ones before forward instead of one call each after the
step); ``--switch-bf16`` reduces the switched side's gradients in bf16
(``communication_data_type``). ``--ablate N`` times the job and its switched side in one
process, two engines in alternating blocks of N steps; without it, a switch trains the job as
switched.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--stage", type=int, default=3, choices=(0, 1, 2, 3))
    ap.add_argument("--switch-stage", type=int, default=None, choices=(0, 1, 2, 3),
                    help="the switched side's ZeRO stage")
    ap.add_argument("--switch-threshold", type=int, default=None,
                    help="the switched side's stage3_param_persistence_threshold")
    ap.add_argument("--switch-bf16", action="store_true",
                    help="the switched side reduces its gradients in bf16")
    ap.add_argument("--ablate", type=int, default=0,
                    help="alternate blocks of N steps without and with the switch")
    args = ap.parse_args()
    import deepspeed

    torch.set_num_threads(1)  # two ranks on a small machine
    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    gen = torch.Generator().manual_seed(rank)
    data = [(torch.randn(args.batch, args.width, generator=gen),
             torch.randint(0, 10, (args.batch,), generator=gen)) for _ in range(8)]
    switch = {"switch_stage": args.switch_stage, "switch_threshold": args.switch_threshold,
              "switch_bf16": args.switch_bf16}
    switched = args.switch_stage is not None or args.switch_threshold is not None or \
        args.switch_bf16
    timer, blocks = plan(args.steps, args.ablate, switched)
    sides = {side for side, _ in blocks}
    engines = {side: build(args, deepspeed, switched=side) for side in sorted(sides)}
    step = 0
    for side, length in blocks:
        engine = engines[side]
        timer.start_block(side)
        for _ in range(length):
            x, y = data[step % len(data)]
            loss = nn.functional.cross_entropy(engine(x), y)
            engine.backward(loss)
            engine.step()
            timer.step()
            step += 1
    if rank == 0:
        timer.report(job="deepspeed_zero", stage=args.stage, **switch)
    torch.distributed.destroy_process_group()


def build(args: argparse.Namespace, deepspeed: Any, switched: bool) -> Any:
    """A DeepSpeed engine over the model, at the job's ZeRO stage or, ``switched``, with the
    switches' settings."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU())
                            for _ in range(args.layers)], nn.Linear(args.width, 10))
    zero: dict[str, Any] = {"stage": args.stage}
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": args.batch, "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": zero}
    if switched:
        if args.switch_stage is not None:
            zero["stage"] = args.switch_stage
        if args.switch_threshold is not None:
            zero["stage3_param_persistence_threshold"] = args.switch_threshold
        if args.switch_bf16:
            config["communication_data_type"] = "bf16"
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=config)
    return engine


if __name__ == "__main__":
    main()
