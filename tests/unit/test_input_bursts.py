"""Bursty input (doctor.rules.input_bursts): workers that keep up on average while a few slow
batches drain the queue get prefetch_factor sized from the waits, not more workers; workers slow
on average, or evenly spread waits, are no burst."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from doctor.rules.input import input_loader
from doctor.rules.input_bursts import bursts
from doctor.verdict import CATEGORIES
from tests.support import evidence

TRAIN_S, USUAL_S, BURST_S = 0.005, 0.0005, 0.040


def ledger(n: int = 200, every: int = 10, usual: float = USUAL_S, burst: float = BURST_S
           ) -> pd.DataFrame:
    """Steps of TRAIN_S training; each waits ``usual`` for its batch, one in ``every`` waits
    ``burst`` (every=0: none)."""
    wait = np.full(n, usual)
    if every:
        wait[every - 1::every] = burst
    row = dict.fromkeys(CATEGORIES, 0.0)
    return pd.DataFrame([{"rank": 0, "step": i + 1, "start_s": float(i), **row,
                          "compute": TRAIN_S, "preprocess": w, "wall_s": TRAIN_S + w,
                          "wait_s": w, "backward_s": TRAIN_S / 2, "optimizer_s": TRAIN_S / 10,
                          "fetch_s": 0.0, "warmup": False, "analyzed": True}
                         for i, w in enumerate(wait)])


def test_workers_that_keep_up_on_average_get_a_deeper_queue() -> None:
    found = bursts(ledger(), workers=2, prefetch=None, slowest_fetch_s=0.006)
    assert found is not None
    assert found.burst_s == pytest.approx(BURST_S) and found.bursts == 20 and found.prefetch == 2
    # the queue must hold, beyond its 2 x 2 batches, the burst and a training step: (40 + 5) / 5
    # batches more over 2 workers
    assert found.suggested == 2 + math.ceil((BURST_S + TRAIN_S) / TRAIN_S / 2)
    # hidden bursts leave each step its training and its usual wait
    mean = TRAIN_S + USUAL_S + (BURST_S - USUAL_S) / 10
    assert found.speedup == pytest.approx(mean / (TRAIN_S + USUAL_S), rel=1e-6)


@pytest.mark.parametrize(("frame", "workers", "fetch"), [
    (ledger(), 2, 0.012),  # the slowest worker needs 12 ms a batch for every 2nd: slow on average
    (ledger(), 0, None),  # no workers: batches are built in the loop
    (ledger(), 2, None),  # the workers' batches were not timed
    (ledger(every=1, usual=0.02, burst=0.02), 2, 0.006),  # every step waits alike
    (ledger(every=0), 2, 0.006),  # no bursts
    (ledger(every=2, burst=0.01), 2, 0.006),  # half the steps wait: no few long ones
])
def test_no_burst(frame: pd.DataFrame, workers: int, fetch: float | None) -> None:
    assert bursts(frame, workers=workers, prefetch=2, slowest_fetch_s=fetch) is None


def test_the_loader_finding_offers_prefetch_factor_with_an_apply() -> None:
    loaders = pd.DataFrame([{"num_workers": 2, "batch_size": 8, "persistent_workers": True,
                             "prefetch_factor": 2, "pin_memory": False}])
    [finding] = input_loader(evidence(ledger=ledger(), loaders=loaders, cores=8,
                                      worker_fetch_s=0.006))
    fix = finding.fixes[0]
    assert fix.title.startswith("Bursty batches: 20 of 200 steps wait 40 ms")
    assert fix.apply == {"dataloader": {"prefetch_factor": 7, "persistent_workers": True}}
    assert "num_workers=2, prefetch_factor=7" in fix.code
    assert finding.estimated_speedup == fix.estimated_speedup > 1.2
    assert finding.evidence["suggested_prefetch_factor"] == 7
