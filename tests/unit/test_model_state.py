"""The model-state probe: parameters, gradients and optimizer state in bytes, against the bytes
computed from the model's own shapes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from doctor.probes.model_state import ModelStateProbe, model_state
from doctor.probes.steps import StepsProbe
from doctor.record.session import WINDOW_END, WINDOW_START, Session
from doctor.store import layout
from doctor.store.reader import load_run
from tests.support import write_record


def by_kind(state: dict) -> dict[str, int]:
    out: dict[str, int] = {}
    for row in state["rows"]:
        out[row["kind"]] = out.get(row["kind"], 0) + row["bytes"]
    return out


def train(model: nn.Module, opt: torch.optim.Optimizer, steps: int = 2) -> None:
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randint(0, 1000, (8,))).sum().backward()
        opt.step()


def test_adam_holds_two_moments_per_parameter() -> None:
    model = nn.Sequential(nn.Embedding(1000, 64), nn.Linear(64, 10))
    opt = torch.optim.Adam(model.parameters())
    train(model, opt)
    numel = 1000 * 64 + 64 * 10 + 10
    got = by_kind(model_state([opt]))
    assert got["parameters"] == 4 * numel
    assert got["gradients"] == 4 * numel
    steps = sum(4 if opt.state[p]["step"].dtype == torch.float32 else 8
                for p in model.parameters())  # Adam's step counters: scalar tensors
    assert got["optimizer_state"] == 2 * 4 * numel + steps


def test_tied_weights_and_two_optimizers_count_each_tensor_once() -> None:
    emb = nn.Embedding(1000, 32)
    head = nn.Linear(32, 1000, bias=False)
    head.weight = emb.weight  # tied
    opt_a = torch.optim.SGD([emb.weight], lr=0.1)
    opt_b = torch.optim.SGD(head.parameters(), lr=0.1)
    state = model_state([opt_a, opt_b])
    assert by_kind(state)["parameters"] == 4 * 1000 * 32
    assert state["parameters"] == 1 and state["optimizers"] == ["SGD", "SGD"]
    assert "optimizer_state" not in by_kind(state)  # plain SGD keeps none


def test_rows_say_each_dtype() -> None:
    model = nn.Linear(128, 128).to(torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 128, dtype=torch.bfloat16)).sum().backward()
    opt.step()
    rows = {(r["kind"], r["dtype"]): r["bytes"] for r in model_state([opt])["rows"]}
    numel = 128 * 128 + 128
    assert rows[("parameters", "bfloat16")] == 2 * numel
    assert rows[("optimizer_state", "bfloat16")] == 2 * numel  # the momentum buffers


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    s = Session(tmp_path, rank=0)
    yield s
    s.close()


def test_the_probe_records_the_optimizers_the_job_steps(session: Session, tmp_path: Path
                                                        ) -> None:
    steps, probe = StepsProbe(session), ModelStateProbe(session)
    steps.start()
    probe.start()
    try:
        model = nn.Linear(256, 256)
        opt = torch.optim.AdamW(model.parameters())
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(4, 256)).sum().backward()
            opt.step()
        session.emit(WINDOW_START)
    finally:
        steps.stop()
        probe.stop()
    [proc_dir] = [d for d, *_ in layout.process_dirs(tmp_path)]
    meta = json.loads((proc_dir / layout.META).read_text())
    got = by_kind(meta["model_state"]["window_start"])
    assert got["parameters"] == 4 * (256 * 256 + 256)
    assert meta["model_state"]["window_start"]["optimizers"] == ["AdamW"]


def test_the_run_reads_the_model_state_by_process_and_tag(session: Session, tmp_path: Path
                                                          ) -> None:
    steps, probe = StepsProbe(session), ModelStateProbe(session)
    steps.start()
    probe.start()
    try:
        model = nn.Linear(64, 64)
        opt = torch.optim.Adam(model.parameters())
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(4, 64)).sum().backward()
            opt.step()
        session.emit(WINDOW_START)
        session.close()  # the exit record
    finally:
        steps.stop()
        probe.stop()
    write_record(tmp_path)
    frame = load_run(tmp_path).model_state
    assert set(frame["tag"]) == {"window_start", "exit"}
    params = frame[(frame["tag"] == "exit") & (frame["kind"] == "parameters")]
    assert params["bytes"].sum() == 4 * (64 * 64 + 64)
    assert set(frame["rank"]) == {0}


def test_saved_tensors_count_the_activations_not_the_weights() -> None:
    from doctor.probes.saved_tensors import SavedTensorCounter

    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 256))
    counter = SavedTensorCounter(torch, model.parameters())
    counter.start()
    try:
        for _ in range(2):
            model(torch.randn(32, 512)).sum().backward()
            counter.step()
    finally:
        counter.stop()
    # saved for backward: the input (32x512, for the first weight's grad), the ReLU's output
    # (32x1024, used by ReLU's backward and as the second Linear's input: one storage), and
    # the first Linear's output only if autograd keeps it (ReLU saves its result instead)
    expected = 4 * (32 * 512 + 32 * 1024)
    assert [b for b, _ in counter.steps] == [expected, expected]
    # the hooks are gone: nothing is counted after stop
    model(torch.randn(32, 512)).sum().backward()
    counter.step()
    assert len(counter.steps) == 2


def test_the_window_records_the_activations_of_its_steps(session: Session, tmp_path: Path
                                                         ) -> None:
    steps, probe = StepsProbe(session), ModelStateProbe(session)
    steps.start()
    probe.start()
    try:
        model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step() -> None:
            opt.zero_grad()
            model(torch.randn(16, 64)).sum().backward()
            opt.step()  # the steps probe counts the step

        step()
        session.emit(WINDOW_START)
        for _ in range(3):
            step()
        session.emit(WINDOW_END)
        step()  # after the window: not counted
    finally:
        steps.stop()
        probe.stop()
    [proc_dir] = [d for d, *_ in layout.process_dirs(tmp_path)]
    meta = json.loads((proc_dir / layout.META).read_text())
    # the window's first two steps only (SAVED_STEPS): activations are alike step to step
    assert meta["saved_tensors"]["steps"] == [[4 * (16 * 64 + 16 * 128), 2]] * 2
    assert meta["saved_tensors"]["dtypes"] == {"cpu:float32": 2 * 4 * (16 * 64 + 16 * 128)}
    write_record(tmp_path)
    frame = load_run(tmp_path).model_state
    acts = frame[frame["kind"] == "activations"]
    assert list(acts[acts["tag"] == "window_step"]["bytes"]) == [4 * (16 * 64 + 16 * 128)] * 2
    [mean] = acts[acts["tag"] == "window"].itertuples()
    assert (mean.device, mean.dtype, mean.bytes) == ("cpu", "float32", 4 * (16 * 64 + 16 * 128))
