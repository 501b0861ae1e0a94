"""Shared by the input-bound sample jobs: the training loop, its ablation, and where their data
lives."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from _timing import AblationTimer, StepTimer, plan
from torch import nn

Loader = Iterable[Any]


def add_image_job_args(ap: argparse.ArgumentParser, images: int, images_help: str, size: int,
                       size_help: str, hidden: int) -> None:
    """The image jobs' common switches: steps, batch, distinct images, their side, the model's
    width and the DataLoader's workers."""
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--images", type=int, default=images, help=images_help)
    ap.add_argument("--size", type=int, default=size, help=size_help)
    ap.add_argument("--hidden", type=int, default=hidden,
                    help="MLP width: the compute part (20-25 %% of the step, --workers 0)")
    ap.add_argument("--workers", type=int, default=0, help="DataLoader num_workers")


def image_mlp(side: int, hidden: int) -> nn.Module:
    """The image jobs' model: an MLP over a 3 x side x side image, ten classes."""
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * side * side, hidden), nn.ReLU(),
                         nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def add_ablation_arg(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--ablate", type=int, default=0, metavar="BLOCK",
                    help="alternate the switch off and on every BLOCK steps in this one process "
                         "(--steps in all) and report the median step of each side")
    ap.add_argument("--switch-after", type=int, default=0, metavar="N",
                    help="run the first N of --steps without the switch and the rest with it, "
                         "in this one process, and report the median step of each side")


def fit_job(args: argparse.Namespace, switched: bool, make_loader: Callable[[bool], Loader],
            model: nn.Module) -> StepTimer | AblationTimer:
    """``--steps`` optimizer steps, one per batch ``(*inputs, target)``, from the loader built
    with the switch as asked; with ``--ablate``, in blocks alternating the loaders built without
    the switch and with it. Each block starts a fresh iterator of its loader, so DataLoader
    workers see the side they serve."""
    timer, sides = plan(args.steps, args.ablate, switched, args.switch_after)
    loaders = {side: make_loader(side) for side in {s for s, _ in sides}}
    print_settings(loaders[sides[0][0]])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for side, length in sides:
        batches = iter(loaders[side])
        timer.start_block(side)
        for _ in range(length):
            *inputs, target = next(batches)
            t0 = time.perf_counter()
            train_step(model, opt, inputs, target)
            timer.train(time.perf_counter() - t0)
            timer.step()
        del batches  # shuts its workers down before the other side's start
    return timer


def print_settings(loader: Loader) -> None:
    """One JSON line with the settings the job runs with, as the job itself sees them (what a
    ``doctor try`` changed shows here)."""
    print(json.dumps({"settings": {
        "num_workers": getattr(loader, "num_workers", None),
        "pin_memory": getattr(loader, "pin_memory", None),
        "persistent_workers": getattr(loader, "persistent_workers", None),
        "torch_threads": torch.get_num_threads(),
        "sharing_strategy": torch.multiprocessing.get_sharing_strategy(),
    }}), flush=True)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, inputs: list[Any],
               target: torch.Tensor) -> None:
    loss = nn.functional.cross_entropy(model(*inputs), target)
    opt.zero_grad()
    loss.backward()
    opt.step()


def in_data_dir(data: str | None, prefix: str, train: Callable[[str], None]) -> None:
    """Run ``train(root)`` in ``data`` (kept), or in a temporary folder removed afterwards."""
    if data:
        os.makedirs(data, exist_ok=True)
        train(data)
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as root:
        train(root)
