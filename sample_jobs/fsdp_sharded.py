"""A sharded data-parallel job (FSDP2 ``fully_shard``, gloo, CPU) whose step time goes to its
collectives: a stack of wide linear layers, each its own FSDP unit, on a per-rank batch so small
that the work is little beside the parameters each unit all-gathers before its forward and again
before its backward, and the gradients it reduce-scatters after.

Run it under torchrun: ``torchrun --nproc-per-node 2 sample_jobs/fsdp_sharded.py``.

Switches: ``--no-shard`` trains the same model on each rank without FSDP (no collective at all: the
per-rank work alone, which is what the communication's share is measured against);
``--no-reshard`` keeps each unit's parameters gathered after forward
(``reshard_after_forward=False``): the all-gathers before backward are gone, for the memory of
the gathered parameters; ``--prefetch`` has each unit gather the next one ahead, in forward
(``set_modules_to_forward_prefetch``) and in backward (``set_modules_to_backward_prefetch``),
without blocking the thread that issued it (FSDP2's asynchronous unshard: on the CPU a
synchronous all-gather holds the training thread, prefetched or not). ``--ablate N`` times both
sides in one process, in alternating blocks of N steps (with ``--no-shard``, ``--no-reshard``
or ``--prefetch`` naming the switched side). ``--fsdp1`` builds the same units with FSDP1's
``FullyShardedDataParallel`` (auto-wrapped; ``--no-reshard``: its ``SHARD_GRAD_OP`` strategy;
``--prefetch`` is FSDP2's).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import cast

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _ddp import start_gloo, train


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--no-shard", action="store_true", help="no FSDP: each rank trains alone")
    ap.add_argument("--no-reshard", action="store_true",
                    help="reshard_after_forward=False: no all-gather before backward")
    ap.add_argument("--prefetch", action="store_true",
                    help="prefetch the next unit's all-gather, asynchronously")
    ap.add_argument("--fsdp1", action="store_true",
                    help="FSDP1's FullyShardedDataParallel, each layer a unit (auto-wrapped); "
                         "with --no-reshard its SHARD_GRAD_OP strategy")
    ap.add_argument("--ablate", type=int, default=0,
                    help="alternate blocks of N steps without and with the switch")
    args = ap.parse_args()
    rank = start_gloo()
    gen = torch.Generator().manual_seed(rank)
    data = [(torch.randn(args.batch, args.width, generator=gen),
             torch.randn(args.batch, args.width, generator=gen)) for _ in range(8)]
    if args.ablate > 0:  # the job as it is and with its switch, in alternating blocks
        train("fsdp_sharded", build(args, False, False), data, args.steps,
              nn.functional.mse_loss, ablate=args.ablate,
              switched=build(args, args.no_shard, args.no_reshard, args.prefetch),
              no_shard=args.no_shard, no_reshard=args.no_reshard, prefetch=args.prefetch)
        return
    train("fsdp_sharded", build(args, args.no_shard, args.no_reshard, args.prefetch), data,
          args.steps, nn.functional.mse_loss, no_shard=args.no_shard,
          no_reshard=args.no_reshard, prefetch=args.prefetch)


def build(args: argparse.Namespace, no_shard: bool, no_reshard: bool,
          prefetch: bool = False) -> nn.Module:
    """The model: each layer an FSDP2 unit (``reshard_after_forward`` unless ``no_reshard``),
    or FSDP1's (``--fsdp1``), or, with ``no_shard``, a plain local module; ``prefetch``: each
    unit gathers the next one ahead, in forward and in backward, asynchronously."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU())
                            for _ in range(args.layers)])
    if not no_shard and args.fsdp1:
        from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        return FullyShardedDataParallel(
            model, auto_wrap_policy=ModuleWrapPolicy({nn.Sequential}),
            device_id=torch.device("cpu"),
            sharding_strategy=ShardingStrategy.SHARD_GRAD_OP if no_reshard
            else ShardingStrategy.FULL_SHARD)
    if not no_shard:
        from torch.distributed.fsdp import fully_shard

        for unit in model:
            fully_shard(unit, reshard_after_forward=not no_reshard)
        fully_shard(model, reshard_after_forward=not no_reshard)
        if prefetch:
            from torch.distributed.fsdp import FSDPModule

            units = [cast(FSDPModule, m) for m in model]
            for i, fsdp_unit in enumerate(units):
                fsdp_unit.set_modules_to_forward_prefetch(units[i + 1:i + 2])
                fsdp_unit.set_modules_to_backward_prefetch(units[max(i - 1, 0):i])
            # the gathers no longer hold the thread that issued them
            cast(FSDPModule, model)._set_unshard_async_op(True)
    return model


if __name__ == "__main__":
    main()
