"""Shared by the memory sample jobs: the bytes their own models and batches imply, computed from
shapes, printed as one JSON line (``{"expected": {...}}``) for tests to compare doctor's
breakdown with."""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from torch import nn


def tensor_bytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def print_expected(**values: float | int | str | None) -> None:
    print(json.dumps({"expected": values}), flush=True)


def mlp(width_in: int, width: int, depth: int, width_out: int) -> nn.Sequential:
    """Linear + ReLU blocks: each ReLU saves its output for backward, which the next Linear
    saves as its input (one storage); the first Linear saves the batch itself."""
    layers: list[nn.Module] = [nn.Linear(width_in, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, width_out))
    return nn.Sequential(*layers)


def mlp_saved_bytes(batch: int, width_in: int, width: int, depth: int, width_out: int,
                    classes_target: bool = True) -> int:
    """Bytes an ``mlp`` saves for backward per step in fp32, with cross-entropy on top (its
    log-softmax output, and the int64 targets)."""
    return 4 * batch * (width_in + depth * width + width_out) + (8 * batch if classes_target
                                                                else 0)


def resident_bytes() -> int:
    """This process's resident bytes (Linux /proc/self/statm)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def seed() -> None:
    torch.manual_seed(0)
