"""A CPU job whose step goes to the optimizer: Adam over hundreds of small parameter tensors,
each updated in turn (torch's default on a CPU), against a forward and backward that are cheap.

Switch: ``--fixed`` builds Adam with ``fused=True``: one kernel updates every tensor.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import StepTimer


def arguments(doc: str | None) -> argparse.Namespace:
    """The switches of an optimizer-bound job (this one, and sample_jobs/lightning_optimizer.py)."""
    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--layers", type=int, default=200)
    ap.add_argument("--fixed", action="store_true", help="remove the bottleneck (fused=True)")
    return ap.parse_args()


def main() -> None:
    args = arguments(__doc__)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(32, 32) for _ in range(args.layers)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, **({"fused": True} if args.fixed else {}))
    x = torch.randn(16, 32)
    timer = StepTimer()
    for _ in range(args.steps):
        loss = model(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        timer.step()
    timer.report(job="optimizer_bound", fixed=args.fixed, tensors=2 * args.layers)


if __name__ == "__main__":
    main()
