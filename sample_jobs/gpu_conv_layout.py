"""A GPU job whose convolutions run on NCHW tensors in 16 bits: a small convolutional network
under autocast, on batches already on the GPU.

The Tensor Cores run convolutions NHWC; on NCHW tensors cuDNN either transposes them to NHWC and
back around each convolution or picks slower kernels, which the trace shows (transpose kernels,
and the inputs' strides).

Switch: ``--fixed`` puts the model and its inputs in ``channels_last``.
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
    ap.add_argument("--channels", type=int, default=128)
    ap.add_argument("--size", type=int, default=56, help="image height and width")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--fixed", action="store_true", help="remove the bottleneck (channels_last)")
    args = ap.parse_args()
    require_cuda("gpu_conv_layout")

    import torch
    from torch import nn

    torch.manual_seed(0)
    device = torch.device("cuda")
    c = args.channels
    layers: list[nn.Module] = [nn.Conv2d(3, c, 3, padding=1), nn.ReLU()]
    for _ in range(6):
        layers += [nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU()]
    model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 10))
    model = model.to(device)
    layout = torch.channels_last if args.fixed else torch.contiguous_format
    model = model.to(memory_format=layout)  # type: ignore[call-overload]
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    batches = [(torch.randn(args.batch, 3, args.size, args.size, device=device)
                .contiguous(memory_format=layout),
                torch.randint(0, 10, (args.batch,), device=device)) for _ in range(8)]
    scaler = torch.amp.GradScaler("cuda")

    timer = StepTimer()
    deadline = time.perf_counter() + args.seconds
    step = 0
    while step < args.steps and time.perf_counter() < deadline:
        x, y = batches[step % len(batches)]
        with torch.autocast("cuda", dtype=torch.float16):
            loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        if step % 20 == 0:
            torch.cuda.synchronize()
        timer.step()
        step += 1
    torch.cuda.synchronize()
    timer.report(job="gpu_conv_layout", fixed=args.fixed)


if __name__ == "__main__":
    main()
