"""A GPU job bound by kernel launches: a deep, narrow MLP on a small batch.

Each step launches a few thousand tiny kernels; the GPU finishes each in microseconds and waits
for the host to launch the next.

Switch: ``--fixed`` captures the whole training step (forward, backward, optimizer) once as a
CUDA graph and replays it: one launch per step instead of thousands.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _gpu import require_cuda
from _timing import StepTimer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=25.0, help="stop after this long")
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--fixed", action="store_true", help="remove the bottleneck (CUDA graph)")
    args = ap.parse_args()
    require_cuda("gpu_launch_bound")

    import torch
    from torch import nn

    torch.manual_seed(0)
    device = torch.device("cuda")
    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.width, args.width), nn.LayerNorm(args.width), nn.GELU()]
    model = nn.Sequential(*layers, nn.Linear(args.width, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    batches = [(torch.randn(args.batch, args.width, device=device),
                torch.randint(0, 10, (args.batch,), device=device)) for _ in range(16)]

    def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        return loss

    replay = None
    static_x, static_y = (t.clone() for t in batches[0])
    if args.fixed:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up (optimizer state, cuBLAS handles) off the graph
            for _ in range(3):
                train_step(static_x, static_y)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            train_step(static_x, static_y)
        replay = graph

    timer = StepTimer()
    deadline = time.perf_counter() + args.seconds
    step = 0
    while step < args.steps and time.perf_counter() < deadline:
        x, y = batches[step % len(batches)]
        if replay is not None:
            static_x.copy_(x)
            static_y.copy_(y)
            replay.replay()
        else:
            train_step(x, y)
        if step % 50 == 0:
            torch.cuda.synchronize()  # keep the host from running far ahead of the GPU
        timer.step()
        step += 1
    torch.cuda.synchronize()
    timer.report(job="gpu_launch_bound", fixed=args.fixed)


if __name__ == "__main__":
    main()
