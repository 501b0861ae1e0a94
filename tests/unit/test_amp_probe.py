"""The mixed-precision part of the steps probe (probes/amp.py) in a real CPU training loop: the
autocast entered and the scaler's settings in the meta, the scale after each update, the losses
that were not finite; and the late reader's GPU path (doctor.record.late_reads) on a fake CUDA:
read in order once each event has passed, none waited for, none past its slots."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from doctor.analyse.scaler import scaler_updates
from doctor.probes.steps import StepsProbe
from doctor.record.late_reads import SLOTS, LateReads
from doctor.record.session import Session
from doctor.store import layout
from doctor.store.reader import load_run
from doctor.store.records import LOSS_INF, scale_of_key
from tests.support import FakeClock, write_record


class Ticking(FakeClock):
    """A clock a microsecond later at each reading: each record has its own time."""

    def __call__(self) -> int:
        self.now += 1000
        return self.now


def train(tmp_path: Path, overflow: set[int], iterations: int = 12) -> dict[str, Any]:
    """A CPU loop under bf16 autocast and a GradScaler, an inf loss at ``overflow``; the
    process's meta."""
    s = Session(tmp_path, clock=Ticking(), window_start=10**9)
    probe = StepsProbe(s)
    probe.start()
    try:
        torch.manual_seed(0)
        model = nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=10**6)
        for i in range(iterations):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(torch.randn(4, 8)).float().pow(2).mean()
            if i in overflow:
                loss = loss * float("inf")
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    finally:
        probe.stop()
        s.close()
    write_record(tmp_path)
    [proc_dir] = [d for d, *_ in layout.process_dirs(tmp_path)]
    return dict(json.loads((proc_dir / layout.META).read_text()))


def test_the_autocast_the_scaler_and_its_scale_are_recorded(tmp_path: Path) -> None:
    meta = train(tmp_path, overflow={3, 7})
    assert meta["autocast"] == [{"device": "cpu", "enabled": True, "dtype": "bfloat16"}]
    [scaler] = meta["scalers"]
    assert scaler["init_scale"] == 2.0**10 and scaler["growth_interval"] == 10**6
    run = load_run(tmp_path)
    [process] = {(int(n), int(r), int(p)) for n, r, p in
                 run.intervals[["node", "rank", "pid"]].itertuples(index=False)}
    t0, _t1, keys = run.intervals_of(process, "scale")
    scales = [scale_of_key(int(k)) for k in keys[t0.argsort()]]
    # the first before the first update, then each change: halved at iterations 3 and 7
    assert scales == [2.0**10, 2.0**9, 2.0**8]
    updates = scaler_updates(run, process)
    assert updates is not None and list(updates.skipped.nonzero()[0]) == [3, 7]
    assert list(updates.scale_after[[2, 3, 7, 11]]) == [2.0**10, 2.0**9, 2.0**8, 2.0**8]
    _b0, _b1, bad = run.intervals_of(process, "nonfinite")
    assert list(bad) == [LOSS_INF, LOSS_INF]


def test_the_probe_puts_autocast_back(tmp_path: Path) -> None:
    enter = torch.amp.autocast_mode.autocast.__enter__
    train(tmp_path, overflow=set(), iterations=2)
    assert torch.amp.autocast_mode.autocast.__enter__ is enter


class FakeEvent:
    def __init__(self, torch: FakeTorch) -> None:
        self.done = False
        self.torch = torch

    def record(self) -> None:
        assert not self.torch.capturing, "an event recorded into the job's CUDA graph"
        self.done = False

    def query(self) -> bool:
        if self.torch.capturing:  # as CUDA does: the job's capture is invalidated
            self.torch.invalidated = True
            raise RuntimeError("operation not permitted when stream is capturing")
        return self.done


class FakeBuffer:
    def __init__(self, shape: Any, dtype: Any) -> None:
        self.shape, self.dtype, self.value = shape, dtype, float("nan")

    def copy_(self, src: FakeTensor, non_blocking: bool = False) -> None:
        assert non_blocking
        self.value = src.value

    def item(self) -> float:
        return self.value

    def numel(self) -> int:
        return len(self.value) if isinstance(self.value, list) else 1

    def tolist(self) -> Any:
        return self.value


class FakeTensor:
    is_cuda, is_cpu, dtype = True, False, "float32"

    def __init__(self, value: Any) -> None:
        self.value = value
        self.shape = (len(value),) if isinstance(value, list) else ()

    def detach(self) -> FakeTensor:
        return self

    def numel(self) -> int:
        return len(self.value) if isinstance(self.value, list) else 1


class FakeTorch:
    """torch as the late reader uses it on a GPU: events whose copies land when a test says."""

    def __init__(self) -> None:
        self.events: list[FakeEvent] = []
        self.capturing = False
        self.invalidated = False
        self.cuda = self

    def empty(self, shape: Any, dtype: Any, pin_memory: bool) -> FakeBuffer:
        assert pin_memory
        return FakeBuffer(shape, dtype)

    def Event(self) -> FakeEvent:
        self.events.append(FakeEvent(self))
        return self.events[-1]

    def is_current_stream_capturing(self) -> bool:
        return self.capturing

    def land(self) -> None:
        for e in self.events:
            e.done = True


def test_on_a_gpu_values_are_read_once_their_copies_landed_in_order() -> None:
    fake = FakeTorch()
    reads = LateReads(fake)
    assert reads.put(FakeTensor(1.0), "a") == []  # in flight: nothing waits
    assert reads.put(FakeTensor(2.0), "b") == []
    fake.land()
    assert reads.put(FakeTensor(3.0), "c") == [("a", 1.0), ("b", 2.0)]
    fake.land()
    assert reads.ready() == [("c", 3.0)]
    assert len(fake.events) == 2  # the landed slots are used again


def test_on_a_gpu_flags_are_read_as_a_list_once_landed() -> None:
    """The overflow watch's flags, one per gradient (probes/overflow_watch.py)."""
    fake = FakeTorch()
    reads = LateReads(fake)
    assert reads.put(FakeTensor([True, False, True]), "flags") == [] and reads.pending
    fake.land()
    assert reads.ready() == [("flags", [True, False, True])] and not reads.pending


def test_on_a_gpu_running_ahead_drops_values_rather_than_wait() -> None:
    fake = FakeTorch()
    reads = LateReads(fake)
    for i in range(SLOTS + 3):
        assert reads.put(FakeTensor(float(i)), i) == []
    assert reads.dropped == 3 and len(fake.events) == SLOTS


def test_while_a_cuda_graph_is_captured_no_event_is_asked_or_recorded() -> None:
    """A query during the capture invalidates the job's graph (seen on an H100: the job's
    torch.cuda.graph failed at its optimizer step): what is in flight is read after it."""
    fake = FakeTorch()
    reads = LateReads(fake)
    assert reads.put(FakeTensor(1.0), "warm-up") == []  # in flight as the capture begins
    fake.capturing = True
    fake.land()
    assert reads.put(FakeTensor(2.0), "captured") == [] and reads.ready() == []
    assert not fake.invalidated and not reads.off and reads.dropped == 1
    fake.capturing = False
    assert reads.put(FakeTensor(3.0), "replayed") == [("warm-up", 1.0)]
    fake.land()
    assert reads.ready() == [("replayed", 3.0)]


def test_a_failing_read_turns_the_reader_off_and_never_raises() -> None:
    reads = LateReads(torch)
    assert reads.put(object(), "x") == [] and reads.off
    assert reads.put(torch.tensor(1.0), "y") == []


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 3.0])
def test_a_cpu_value_is_read_at_once(value: float) -> None:
    [(tag, got)] = LateReads(torch).put(torch.tensor(value, requires_grad=True) * 1, "t")
    assert tag == "t" and (got == value or (got != got and value != value))


def test_an_autocast_inside_a_compiled_function_breaks_no_graph(tmp_path: Path) -> None:
    """Dynamo knows torch.autocast by its class, not its __enter__: the wrapper changes nothing
    for a compiled region that autocasts."""
    from torch._dynamo.utils import counters

    s = Session(tmp_path, clock=Ticking(), window_start=10**9)
    probe = StepsProbe(s)
    probe.start()
    try:
        def f(x: torch.Tensor) -> torch.Tensor:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return (x @ x).sum()

        counters.clear()
        out = torch.compile(f, backend="eager")(torch.randn(8, 8))
        assert out.dtype == torch.bfloat16
        assert not counters["graph_break"] and counters["frames"]["ok"] == 1
    finally:
        probe.stop()
        s.close()


def test_at_the_end_copies_in_flight_are_waited_for_briefly_never_for_ever() -> None:
    fake = FakeTorch()
    reads = LateReads(fake)
    reads.put(FakeTensor(1.0), "last")
    assert reads.final(wait_s=0.01) == [] and reads.pending  # a GPU that never gets there
    timer = threading.Timer(0.01, fake.land)
    timer.start()
    assert reads.final(wait_s=5.0) == [("last", 1.0)] and not reads.pending
    timer.join()


def test_a_loss_in_flight_at_the_end_is_recorded_before_the_session_closes(tmp_path: Path) -> None:
    """doctor's exit closes the Session, then stops the probes: a GPU job's last loss, read as
    the Session closes, reaches its ring (on an H100, the last of 100 inf losses was lost)."""
    s = Session(tmp_path, clock=Ticking(), window_start=10**9)
    probe = StepsProbe(s)
    probe.start()
    fake = FakeTorch()
    probe._amp._losses = LateReads(fake)
    probe._amp.backward_ended(FakeTensor(float("inf")), 5, 6)
    fake.land()
    s.close()  # as doctor.bootstrap does at exit
    probe.stop()
    write_record(tmp_path)
    run = load_run(tmp_path)
    [process] = {(int(n), int(r), int(p)) for n, r, p in
                 run.intervals[["node", "rank", "pid"]].itertuples(index=False)}
    _b0, _b1, bad = run.intervals_of(process, "nonfinite")
    assert list(bad) == [LOSS_INF]
