"""The handoff probe (doctor.probes.handoff) and the tensor count the DataLoader probe takes."""

from __future__ import annotations

import torch

from doctor.probes.dataloader import count_tensors
from doctor.probes.handoff import fd_handoff_seconds


def test_the_fd_round_trip_is_measured() -> None:
    seconds = fd_handoff_seconds(rounds=6)
    assert seconds is not None and seconds > 0


def test_tensors_are_counted_through_nested_batches() -> None:
    t = torch.zeros(2)
    assert count_tensors((t, t, t)) == 3
    assert count_tensors({"ids": t, "mask": t, "meta": {"lengths": [t, t]}, "name": "x"}) == 4
    assert count_tensors([1, 2.0, "text", None]) == 0
    assert count_tensors(t) == 1
