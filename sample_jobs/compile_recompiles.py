"""A CPU job whose compiled model recompiles: torch.compile specialises on the input's length,
and the batches come in ``--lengths`` different lengths, so each new length compiles again
(after 8 compilations of one frame, Dynamo runs it eagerly from then on).

Switch: ``--fixed`` compiles with ``dynamic=True``: one graph serves every length.
``--graph-break`` adds a data-dependent branch to the forward (a graph break: Dynamo compiles
the code before and after it as two graphs, and runs the branch eagerly); the job prints the
line of that branch (``break_line``) and the recompilations it expects (``recompiles``: each
new length compiles the model's forward again).
``--backend aot_eager`` traces without generating code (seconds, not minutes, on a small CPU).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import StepTimer


class Clipped(nn.Module):
    """The model; with ``graph_break``, its output clipped where it is large, which the job
    decides in Python from the tensor's values (a graph break)."""

    def __init__(self, graph_break: bool) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
        self.graph_break = graph_break

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        if self.graph_break and y.abs().max() > 1e3:  # BREAK: the branch reads a value
            y = y.clamp(-1e3, 1e3)
        return y


def break_line() -> int:
    lines, first = inspect.getsourcelines(Clipped.forward)
    return first + next(i for i, text in enumerate(lines) if "# BREAK" in text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--lengths", type=int, default=5, help="distinct input lengths")
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--fixed", action="store_true", help="remove the bottleneck (dynamic=True)")
    ap.add_argument("--graph-break", action="store_true", help="a data-dependent branch")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = Clipped(args.graph_break)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    compiled = torch.compile(model, backend=args.backend, dynamic=bool(args.fixed))
    # as the job sees it: torch.compile wraps the model (or, compile=off, hands it back)
    print(json.dumps({"settings": {"compiled": compiled is not model}}), flush=True)
    lengths = [16 + 8 * i for i in range(args.lengths)]
    timer = StepTimer()
    first_pass_s = 0.0
    for i in range(args.steps):
        t0 = time.perf_counter()
        x = torch.randn(32, lengths[i % len(lengths)], 64)
        loss = compiled(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i < len(lengths):  # each length's first step: its compile, where it compiles
            first_pass_s += time.perf_counter() - t0
        timer.step()
    timer.report(job="compile_recompiles", fixed=args.fixed, lengths=args.lengths,
                 first_pass_s=first_pass_s,
                 recompiles=0 if args.fixed else min(args.lengths, args.steps) - 1,
                 graph_break=args.graph_break,
                 break_line=break_line() if args.graph_break else None)


if __name__ == "__main__":
    main()
