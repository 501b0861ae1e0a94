from __future__ import annotations

import json
import os
from pathlib import Path

from doctor.record.session import STEP_BACKWARD, STEP_DATALOADER, STEP_OPTIMIZER, Session
from tests.support import FakeClock


class RecordingWindow:
    def __init__(self) -> None:
        self.counts: list[int] = []
        self.closed = False

    def on_step(self, count: int) -> None:
        self.counts.append(count)

    def close(self) -> None:
        self.closed = True


def test_nothing_is_written_until_something_is_recorded(tmp_path: Path) -> None:
    s = Session(tmp_path, rank=0)
    s.close()
    assert list(tmp_path.iterdir()) == []


def test_process_folder_and_meta(tmp_path: Path) -> None:
    s = Session(tmp_path, rank=3, clock=FakeClock())
    s.record_interval("loader_wait", 1, 2)
    folder = tmp_path / "rank-3" / f"main-{os.getpid()}"
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["rank"] == 3 and meta["pid"] == os.getpid()
    s.close()
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["rings"] == {"loader_wait": 1}


def test_the_window_counts_only_the_strongest_kind_of_step(tmp_path: Path) -> None:
    s = Session(tmp_path, clock=FakeClock())
    window = RecordingWindow()
    s.on_step(window.on_step)
    s.on("close", window.close)
    for _ in range(3):
        s.count_step(STEP_DATALOADER)
        s.count_step(STEP_BACKWARD)
        s.record_optimizer_start()
        s.record_optimizer_end(0)
        s.record_optimizer_start()
        s.record_optimizer_end(1)  # a second optimizer does not count twice
    # dataloader 1, backward restarts at 1, optimizer restarts at 1, then 2 and 3
    assert window.counts == [1, 1, 1, 2, 3]
    assert s._counter.kind == STEP_OPTIMIZER  # the strongest kind seen counts
    s.close()
    assert window.closed


def test_loader_settings_are_recorded_once(tmp_path: Path) -> None:
    s = Session(tmp_path, clock=FakeClock())
    a = s.record_loader({"num_workers": 0, "batch_size": 8})
    b = s.record_loader({"num_workers": 0, "batch_size": 8})
    c = s.record_loader({"num_workers": 2, "batch_size": 8})
    assert a == b == 0 and c == 1
    meta = json.loads((s.directory / "meta.json").read_text())
    assert [lo["num_workers"] for lo in meta["loaders"]] == [0, 2]
    s.close()


def test_a_loaders_batch_tensors_are_recorded_once(tmp_path: Path) -> None:
    s = Session(tmp_path, clock=FakeClock())
    s.record_batch_tensors(0, 3)
    s.record_batch_tensors(0, 5)  # a later iterator of the same loader
    s.record_batch_tensors(1, 2)
    meta = json.loads((s.directory / "meta.json").read_text())
    assert meta["batch_tensors"] == {"0": 3, "1": 2}
    s.close()


def test_a_forked_child_writes_its_own_folder(tmp_path: Path) -> None:
    s = Session(tmp_path, clock=FakeClock())
    s.record_interval("loader_wait", 1, 2)
    parent_dir = s.directory
    s.forked()  # what the at-fork hook runs in the child
    s.role = "worker0"
    s.record_interval("fetch", 3, 4)
    assert s.directory != parent_dir
    assert s.directory.name.startswith("worker0-")
    s.close()


def test_closed_sessions_record_nothing(tmp_path: Path) -> None:
    s = Session(tmp_path, clock=FakeClock())
    s.close()
    s.record_interval("loader_wait", 1, 2)
    s.record_optimizer_end(0)
    assert list(tmp_path.iterdir()) == []


def test_two_threads_recording_first_at_once_make_one_folder_and_one_ring(
        tmp_path: Path, monkeypatch) -> None:
    """A job training in two threads: each thread's first record makes the process folder
    (and its first ring) on first use; both at once made two folders for one process."""
    import threading

    from doctor.store.process import ProcessWriter

    both = threading.Barrier(2, timeout=0.1)  # met only where both threads create at once
    create = ProcessWriter.create

    def slow_create(self: ProcessWriter) -> None:
        try:
            both.wait()
        except threading.BrokenBarrierError:
            pass
        create(self)

    monkeypatch.setattr(ProcessWriter, "create", slow_create)
    s = Session(tmp_path, rank=0, clock=FakeClock())
    threads = [threading.Thread(target=s.record_interval, args=("backward", 0, 1))
               for _ in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    s.close()
    assert [p.name for p in (tmp_path / "rank-0").iterdir()] == [f"main-{os.getpid()}"]
    assert s.ring("backward", "", ()).written == 2  # one ring, both intervals in it
