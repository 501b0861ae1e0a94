"""Shared by the input-bound sample jobs: the training loop, its ablation, and where their data
lives."""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable, Iterable
from typing import Any

import torch
from _timing import AblationTimer, StepTimer, blocks
from torch import nn

Loader = Iterable[Any]


def add_ablation_arg(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--ablate", type=int, default=0, metavar="BLOCK",
                    help="alternate the switch off and on every BLOCK steps in this one process "
                         "(--steps in all) and report the median step of each side")


def fit(loader: Loader, model: nn.Module) -> StepTimer:
    """One optimizer step per batch ``(*inputs, target)``; the job's own step clock."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    timer = StepTimer()
    for *inputs, target in loader:
        train_step(model, opt, inputs, target)
        timer.step()
    return timer


def fit_ablation(loaders: dict[bool, Loader], model: nn.Module, steps: int,
                 block: int) -> AblationTimer:
    """``steps`` optimizer steps in blocks of ``block``, alternating the loader built without
    the switch (False) and with it (True); each block starts a fresh iterator of its loader, so
    DataLoader workers see the side they serve."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    timer = AblationTimer(block)
    for switched, length in blocks(steps, block):
        batches = iter(loaders[switched])
        timer.start_block(switched)
        for _ in range(length):
            *inputs, target = next(batches)
            train_step(model, opt, inputs, target)
            timer.step()
        del batches  # shuts its workers down before the other side's start
    return timer


def fit_job(args: argparse.Namespace, switched: bool, make_loader: Callable[[bool], Loader],
            model: nn.Module) -> StepTimer | AblationTimer:
    """The job's run: with ``--ablate``, both sides in alternation; else the side asked for."""
    if args.ablate > 0:
        return fit_ablation({False: make_loader(False), True: make_loader(True)}, model,
                            args.steps, args.ablate)
    return fit(make_loader(switched), model)


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
