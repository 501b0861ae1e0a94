"""Advice that fits the device: a CPU job gets no snippet that only runs on a GPU (``.cuda()``,
``device='cuda'``, ``non_blocking=True``, ``pin_memory=True``), while a GPU job keeps them; the
loader fixes write the loader's own batch size; a fix's sentence ends."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from doctor.analyse.split import OutsideLoader
from doctor.rules import default_rules, run_rules
from doctor.rules.input_model import batch_argument
from doctor.verdict import CATEGORIES, Finding
from tests.support import evidence

GPU_ONLY = re.compile(r"\.cuda\(|device=.cuda.|non_blocking=True|pin_memory=True|"
                      r"torch\.cuda\.")


def ledger(wait: float, compute: float = 0.02, n: int = 30) -> pd.DataFrame:
    row = dict.fromkeys(CATEGORIES, 0.0)
    row.update(preprocess=wait, compute=compute)
    return pd.DataFrame([{"rank": 0, "step": i + 1, "start_s": float(i), "wall_s": wait + compute,
                          **row, "wait_s": wait, "backward_s": compute / 2,
                          "optimizer_s": compute / 10, "fetch_s": wait, "warmup": False,
                          "analyzed": True} for i in range(n)])


def loaders(**settings: object) -> pd.DataFrame:
    return pd.DataFrame([{"num_workers": 0, "batch_size": 32, "persistent_workers": False,
                          "prefetch_factor": None, "pin_memory": False, **settings}])


def findings_of(device: str) -> list[Finding]:
    """Every finding the rules make of input-bound jobs on ``device``: a loader whose wait is
    split into each stage, one whose wait could not be split (its settings unknown), batches
    built outside a DataLoader."""
    split = {"io": 0.34, "decode": 0.33, "preprocess": 0.33}
    cases = [
        evidence(ledger=ledger(0.08), loaders=loaders(), cores=4, device=device, split=split,
                 top={s: ("f (train.py:1)",) for s in split}),
        evidence(ledger=ledger(0.08), cores=4, device=device),
        evidence(ledger=ledger(0.0, compute=0.1), cores=4, device=device,
                 outside_loader=OutsideLoader({"preprocess": 0.5}, ("get_batch (t.py:3)",))),
    ]
    return [f for e in cases for f in run_rules(e, default_rules()).findings]


def test_a_cpu_job_gets_no_gpu_only_code() -> None:
    findings = findings_of("cpu")
    assert {"input.loader", "input.io", "input.decode", "input.preprocess", "input.unsplit",
            "input.outside_loader"} <= {f.id for f in findings}
    offending = [(f.id, x.title) for f in findings for x in f.fixes if GPU_ONLY.search(x.code)]
    assert offending == []


def test_a_gpu_job_keeps_its_gpu_code() -> None:
    codes = "\n".join(x.code for f in findings_of("cuda") for x in f.fixes)
    assert "device='cuda'" in codes and "non_blocking=True" in codes
    assert "pin_memory=True" in codes


@pytest.mark.parametrize(("loader", "said"), [
    ({"batch_size": 16, "batched": True}, "batch_size=16"),
    ({"batch_size": None, "batched": True}, "batch_size=batch_size"),  # a sampler's, unread
    ({"batch_size": None}, "batch_size=batch_size"),  # recorded before batching was
    ({"batch_size": float("nan"), "batched": None}, "batch_size=batch_size"),
    ({"batch_size": None, "batched": False}, "batch_size=None"),  # batching off: as it is
])
def test_the_batch_size_a_loader_fix_writes(loader: dict, said: str) -> None:
    assert batch_argument(loader) == said


def test_every_loader_fix_keeps_the_batch_size() -> None:
    """A DataLoader(...) that a fix writes without batch_size batches one sample at a time if
    copied."""
    for f in findings_of("cpu") + findings_of("cuda"):
        for x in f.fixes:
            for call in re.findall(r"DataLoader\(dataset[^)]*\)", x.code):
                assert "batch_size=" in call, (f.id, x.title, call)

