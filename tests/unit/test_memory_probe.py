"""The memory probe on a fake torch.cuda (no GPU here) and its path into the fragmentation rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from doctor.probes.memory import MemoryProbe
from doctor.record.session import Session
from doctor.rules import Evidence
from doctor.rules.memory import fragmentation
from doctor.store.samples import read_memory
from tests.support import FakeClock, FakeCuda, fake_torch

MIB = 1 << 20


def test_snapshots_feed_the_fragmentation_rule(tmp_path: Path) -> None:
    torch = fake_torch()
    session = Session(tmp_path, rank=0, clock=FakeClock())
    probe = MemoryProbe(session, torch)
    assert probe.check().ok
    probe.start()
    session.emit("window_start")  # the profiler window opens
    torch.cuda.stats["num_ooms"] = 1
    torch.observers[0](0, 512 * MIB, 0, 0)  # the allocator reports an OOM
    session.close()
    frame = read_memory({session.pid: session.directory})
    assert list(frame["tag"]) == ["window_start", "oom", "exit"]
    idle = Session(tmp_path / "idle", rank=0, clock=FakeClock())
    probe = MemoryProbe(idle, fake_torch())
    probe.start()
    idle.close()  # a process that recorded nothing gets no folder for an exit snapshot
    assert not (tmp_path / "idle").exists()
    [finding] = fragmentation(Evidence(memory=frame))
    assert finding.id == "memory.fragmentation"
    assert finding.severity == "critical"  # an OOM happened
    assert finding.evidence["would_free_bytes"] == 1500 * MIB
    assert "expandable_segments:True" in finding.fixes[0].code


def test_cpu_only_torch_says_why() -> None:
    class NoCuda(FakeCuda):
        def is_available(self) -> bool:
            return False

    torch = fake_torch(NoCuda())
    torch.version.cuda = None
    status = MemoryProbe(Session(Path("unused")), torch).check()
    assert not status.ok
    assert "CPU-only torch build" in status.reason


def test_real_torch_here_reports_unavailable_or_works() -> None:
    status = MemoryProbe(Session(Path("unused"))).check()
    assert status.ok or "GPU" in status.reason


def test_cut_lines_and_missing_files_are_tolerated(tmp_path: Path) -> None:
    (tmp_path / "memory.jsonl").write_text('{"t_ns": 5, "tag": "exit", "reserved_bytes": 1}\n{"t_n')
    frame = read_memory({1: tmp_path, 2: tmp_path / "missing"})
    assert len(frame) == 1
    assert read_memory({}).empty


def test_step_snapshots_come_about_once_a_second_whatever_the_step_time(tmp_path: Path) -> None:
    clock = FakeClock()
    session = Session(tmp_path, rank=0, clock=clock)
    torch = fake_torch()
    probe = MemoryProbe(session, torch)
    probe.start()
    for step in range(1, 2001):  # 10 ms steps: 20 s
        torch.cuda.stats["allocated_bytes.all.current"] = (2000 + step) * MIB
        clock.tick(0.01)
        session.count_step(3)
    session.close()
    frame = read_memory({session.pid: session.directory})
    steps = frame[frame["tag"] == "step"]
    assert 10 <= len(steps) <= 45  # ~1 Hz, not 2000 rows
    assert steps["step"].is_monotonic_increasing
    # the allocated bytes were read at the steps they are filed under
    assert (steps["allocated_bytes"] == (2000 + steps["step"]) * MIB).all()
    assert frame["tag"].iloc[-1] == "exit"
    assert (frame["total_bytes"] == 80 * 1024 * MIB).all()


def test_the_nested_statistics_from_cpp_read_as_the_flat_ones(tmp_path: Path) -> None:
    torch = fake_torch()
    flat = torch.cuda.stats

    def nested(device: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in flat.items():
            *path, last = key.split(".")
            node = out
            for part in path:
                node = node.setdefault(part, {})
            node[last] = value
        return out

    torch._C._cuda_memoryStats = nested
    session = Session(tmp_path, rank=0, clock=FakeClock())
    probe = MemoryProbe(session, torch)
    probe.start()
    session.emit("window_start")
    session.close()
    frame = read_memory({session.pid: session.directory})
    row = frame.iloc[0]
    assert row["allocated_bytes"] == flat["allocated_bytes.all.current"]
    assert row["inactive_split_bytes"] == 1500 * MIB and row["alloc_retries"] == 3
