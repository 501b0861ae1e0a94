"""A GPU job that fragments the CUDA caching allocator.

Every step frees a random half of a pool of live tensors of odd sizes (20-400 MB) and allocates
new ones of other odd sizes, under a memory cap; cached blocks get split and the splits cannot be
reused, so reserved memory grows past what is allocated, allocations retry (the allocator frees
its cache and synchronises) and some fail. A small matmul, trained by SGD, stands in for the
model.

Switch: ``--fixed`` sets ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` before CUDA starts:
segments grow in place and leave no unusable splits.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=25.0, help="stop after this long")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--cap-gib", type=float, default=8.0, help="memory cap for this process")
    ap.add_argument("--fixed", action="store_true", help="remove the bottleneck")
    args = ap.parse_args()
    if args.fixed:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"

    from _gpu import require_cuda
    from _timing import StepTimer

    require_cuda("gpu_fragmenting")
    import torch

    random.seed(0)
    torch.manual_seed(0)
    device = torch.device("cuda", torch.cuda.current_device())  # an index: the fraction needs one
    total = torch.cuda.get_device_properties(device).total_memory
    cap = int(args.cap_gib * (1 << 30))
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), device)
    budget = int(cap * 0.8)
    weight = torch.nn.Parameter(torch.randn(2048, 2048, device=device) / 64)
    opt = torch.optim.SGD([weight], lr=1e-4)
    pool: list[torch.Tensor] = []
    ooms = 0
    timer = StepTimer()
    deadline = time.perf_counter() + args.seconds
    step = 0
    while step < args.steps and time.perf_counter() < deadline:
        random.shuffle(pool)
        del pool[: len(pool) // 2]
        # the step runs where half the pool was just freed, then the pool refills around it
        x = torch.randn(1024, 2048, device=device)
        for _ in range(4):
            x = torch.tanh(x @ weight)
        opt.zero_grad()
        x.square().mean().backward()
        opt.step()
        del x
        live = sum(t.numel() * t.element_size() for t in pool)
        while live < budget:
            nbytes = random.randrange(20 << 20, 400 << 20) + random.randrange(1, 4096) * 512
            try:
                pool.append(torch.empty(nbytes // 4, dtype=torch.float32, device=device))
            except torch.cuda.OutOfMemoryError:
                ooms += 1
                break
            live += nbytes
        timer.step()
        step += 1
    stats = torch.cuda.memory_stats(device)
    timer.report(
        job="gpu_fragmenting", fixed=args.fixed, caught_ooms=ooms,
        reserved_bytes=stats.get("reserved_bytes.all.current", 0),
        allocated_bytes=stats.get("allocated_bytes.all.current", 0),
        inactive_split_bytes=stats.get("inactive_split_bytes.all.current", 0),
        alloc_retries=stats.get("num_alloc_retries", 0), num_ooms=stats.get("num_ooms", 0),
    )


if __name__ == "__main__":
    main()
