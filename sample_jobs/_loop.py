"""Shared by the input-bound sample jobs: the training loop, and where their data lives."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable
from typing import Any

import torch
from _timing import StepTimer
from torch import nn


def fit(loader: Iterable[Any], model: nn.Module) -> StepTimer:
    """One optimizer step per batch ``(*inputs, target)``; the job's own step clock."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    timer = StepTimer()
    for *inputs, target in loader:
        loss = nn.functional.cross_entropy(model(*inputs), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        timer.step()
    return timer


def in_data_dir(data: str | None, prefix: str, train: Callable[[str], None]) -> None:
    """Run ``train(root)`` in ``data`` (kept), or in a temporary folder removed afterwards."""
    if data:
        os.makedirs(data, exist_ok=True)
        train(data)
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as root:
        train(root)
