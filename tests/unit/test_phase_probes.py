"""What the phases rest on, recorded in-job: the checkpoints probe (torch.save and the savers
imported later, wrapped and put back; bytes from a path or a file object; nothing from other
threads or nested saves; the job's own errors untouched) and the DataLoader probe's marks
(batches asked for with autograd off, each iterator made, the loader found exhausted)."""

from __future__ import annotations

import io
import sys
import threading
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from doctor.probes.checkpoints import SAFETENSORS, TORCH_SAVE, CheckpointProbe
from doctor.probes.dataloader import DataLoaderProbe
from doctor.record.session import Session
from doctor.store.reader import load_run
from doctor.store.records import LOADER_ID_MASK, LOADER_NO_GRAD, checkpoint_key_parts
from tests.support import FakeClock, write_record


def rows(run_dir: Path, name: str) -> list[tuple[int, int, int]]:
    write_record(run_dir)
    run = load_run(run_dir)
    r = run.intervals[run.intervals["name"] == name]
    return [(int(a), int(b), int(k)) for a, b, k in zip(r["t0_ns"], r["t1_ns"], r["key"],
                                                         strict=True)]


def started(tmp_path: Path) -> tuple[Session, CheckpointProbe]:
    s = Session(tmp_path, rank=0, clock=FakeClock(), window_start=10**9)
    s.record_interval("loader_wait", 1, 2)  # the process records: its folder exists
    probe = CheckpointProbe(s)
    probe.start()
    return s, probe


def test_torch_save_is_recorded_with_its_bytes_and_put_back(tmp_path: Path) -> None:
    original = torch.save
    s, probe = started(tmp_path / "run")
    try:
        path = tmp_path / "ckpt.pt"
        torch.save({"w": torch.zeros(1000)}, path)
        buffer = io.BytesIO(b"x" * 10)
        buffer.seek(10)
        torch.save(torch.zeros(500), buffer)
        in_buffer = buffer.tell() - 10
    finally:
        probe.stop()
        s.close()
    assert torch.save is original
    saves = [checkpoint_key_parts(k) for _, _, k in rows(tmp_path / "run", "checkpoint")]
    assert [kind for kind, _ in saves] == [TORCH_SAVE, TORCH_SAVE]
    # to the KiB
    assert saves[0][1] == pytest.approx(path.stat().st_size, abs=1024)
    assert saves[1][1] == pytest.approx(in_buffer, abs=1024)


def test_saves_from_other_threads_and_inside_a_save_are_not_recorded(tmp_path: Path) -> None:
    s, probe = started(tmp_path / "run")
    try:
        worker = threading.Thread(target=torch.save, args=(torch.zeros(10), io.BytesIO()))
        worker.start()
        worker.join()
        probe._depth = 1  # as inside torch.distributed.checkpoint.save
        torch.save(torch.zeros(10), io.BytesIO())
        probe._depth = 0
    finally:
        probe.stop()
        s.close()
    assert rows(tmp_path / "run", "checkpoint") == []


def test_a_failing_save_raises_the_jobs_own_error(tmp_path: Path) -> None:
    s, probe = started(tmp_path / "run")
    try:
        with pytest.raises((FileNotFoundError, RuntimeError)):
            torch.save(torch.zeros(3), tmp_path / "no" / "such" / "dir" / "x.pt")
        assert probe._depth == 0
    finally:
        probe.stop()
        s.close()


def test_a_saver_imported_before_is_wrapped_and_one_not_yet_waits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    written: list[Any] = []

    def save_file(tensors: Any, filename: str, metadata: Any = None) -> None:
        Path(filename).write_bytes(b"y" * 4096)
        written.append(filename)

    fake = types.ModuleType("safetensors.torch")
    fake.save_file = save_file  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "safetensors.torch", fake)
    monkeypatch.delitem(sys.modules, "torch.distributed.checkpoint", raising=False)
    before = list(sys.meta_path)
    s, probe = started(tmp_path / "run")
    try:
        assert len(sys.meta_path) == len(before) + 1  # waits for torch.distributed.checkpoint
        fake.save_file({}, str(tmp_path / "m.safetensors"))  # type: ignore[attr-defined]
    finally:
        probe.stop()
        s.close()
    assert sys.meta_path == before and fake.save_file is save_file  # type: ignore[attr-defined]
    [(_, _, key)] = rows(tmp_path / "run", "checkpoint")
    assert checkpoint_key_parts(key) == (SAFETENSORS, 4096)


def test_the_loader_marks_batches_without_autograd_iterators_and_the_end(tmp_path: Path
                                                                          ) -> None:
    s = Session(tmp_path, rank=0, clock=FakeClock(), window_start=10**9)
    probe = DataLoaderProbe(s)
    probe.start()
    try:
        loader = DataLoader(TensorDataset(torch.zeros(8, 2)), batch_size=2)
        assert len(list(loader)) == 4
        with torch.no_grad():
            assert len(list(loader)) == 4
    finally:
        probe.stop()
        s.close()
    waits = rows(tmp_path, "loader_wait")
    assert [bool(k & LOADER_NO_GRAD) for _, _, k in waits] == [False] * 4 + [True] * 4
    assert {k & LOADER_ID_MASK for _, _, k in waits} == {0}
    assert [k for _, _, k in rows(tmp_path, "loader_iter")] == [0, 0]
    assert [k for _, _, k in rows(tmp_path, "loader_end")] == [0, 0]
