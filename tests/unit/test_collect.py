"""The block collector (doctor.trace.collect) gives the timeline the per-event one gave
(tests/reference_collector.py), on every recorded trace and on events made to be awkward: every
kind's times and columns, the steps, the threads; names compared as text (their codes may be
given in another order)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from doctor.trace import events as events_module
from doctor.trace import reader
from doctor.trace.events import build_timeline, load_timeline
from doctor.trace.parallel import load_timeline_parallel
from tests.reference_collector import reference_from_dicts, reference_timeline
from tests.trace_files import AWKWARD, TRICKY, assert_same_timeline, write_events


@pytest.mark.parametrize("block", [64, 300, 1 << 20])
def test_awkward_events_give_the_per_event_timeline(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    block: int) -> None:
    monkeypatch.setattr(reader, "BLOCK_CHARS", block)
    monkeypatch.setattr(events_module, "SCANNER", False)  # msgspec's blocks, cut small
    events = [dict(ev, ts=ev["ts"] + 100 * k) if isinstance(ev.get("ts"), int) else ev
              for k in range(5) for ev in AWKWARD]
    path = write_events(tmp_path / "t.json", events)
    got = load_timeline(path)
    assert_same_timeline(got, reference_timeline(path))
    assert_same_timeline(build_timeline(events), reference_from_dicts(events))
    for kind in ("host_ops", "kernels", "runtime", "memcpy", "memset", "memory", "comm_ops",
                 "comm_kernels", "dataloader", "optimizer_steps", "python"):
        assert len(getattr(got, kind)) > 0, kind  # each kind has events to compare
    assert got.steps and any(got.host_ops.attrs["layout"] > 0)


def test_a_timeline_of_no_events() -> None:
    empty = build_timeline([])
    assert_same_timeline(empty, reference_from_dicts([]))
    assert json.dumps(empty.tids) == "[]"


@pytest.mark.parametrize("block", [64, 300, 4096])
def test_awkward_events_read_on_several_cores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              block: int) -> None:
    """Cuts inside a value (the tricky strings hold "}, {") make a block that does not decode:
    the trace is read again one block after the other; events larger than a block are decoded
    by the reading process itself."""
    monkeypatch.setattr(reader, "BLOCK_CHARS", block)
    events = [dict(ev, ts=ev["ts"] + 100 * k) if isinstance(ev.get("ts"), int) else ev
              for k in range(20) for ev in AWKWARD]
    path = write_events(tmp_path / "t.json", events)
    assert_same_timeline(load_timeline_parallel(path, 2), reference_timeline(path))


@pytest.mark.parametrize("scanner", [False, True])
def test_a_single_large_trace_is_read_on_several_cores(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       scanner: bool) -> None:
    """Without the C scanner, a large trace's blocks are decoded by several processes; the
    scanner reads it on two cores by itself (gunzip beside the scan)."""
    from doctor.trace import parallel, scan, tables

    if scanner and not scan.AVAILABLE:
        pytest.skip("the C scanner is not built here")
    monkeypatch.setattr(tables, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(tables, "SCANNER", scanner)
    calls = []
    real = parallel.load_timeline_parallel
    monkeypatch.setattr(parallel, "load_timeline_parallel",
                        lambda p, w: calls.append(w) or real(p, w))
    path = write_events(tmp_path / "t.json",
                        [ev for ev in TRICKY if isinstance(ev.get("args"), dict)])
    [got] = tables.read_timelines([path], workers=2)
    assert calls == ([] if scanner else [2])
    assert_same_timeline(got, reference_timeline(path))


def test_a_cut_inside_a_string_is_read_again_one_block_after_the_other(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from doctor.trace import parallel

    monkeypatch.setattr(reader, "BLOCK_CHARS", 1000)
    # the last "}, {" before each block's end is inside a name, not between events
    events = [{"ph": "X", "cat": "cpu_op", "name": f"op{k} }}, {{" + "y" * 1500, "ts": k,
               "dur": 1, "tid": 1} for k in range(40)]
    path = write_events(tmp_path / "t.json", events)
    again = []
    monkeypatch.setattr(parallel, "load_timeline",
                        lambda p, limit: again.append(p) or load_timeline(p, limit))
    got = load_timeline_parallel(path, 2)
    assert again == [path]
    assert_same_timeline(got, reference_timeline(path))
    assert len(got.host_ops) == 40


def test_a_truncated_trace_read_on_several_cores_is_one_line(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    monkeypatch.setattr(reader, "BLOCK_CHARS", 2000)
    text = json.dumps({"traceEvents": AWKWARD * 40})
    path = tmp_path / "cut.json"
    path.write_text(text[: len(text) // 2])
    with pytest.raises(reader.TraceError) as err:
        load_timeline_parallel(path, 2)
    assert "\n" not in str(err.value) and "cut.json" in str(err.value)


def _host_ops_read_in(path: Path) -> int:
    from doctor.trace import tables

    return len(tables.read_timelines([path], workers=2)[0].host_ops)


def test_a_daemonic_process_reads_a_trace_by_itself(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool's worker may not start processes: a trace read there is read by that worker."""
    import multiprocessing

    from doctor.trace import tables

    monkeypatch.setattr(tables, "PARALLEL_BYTES", 0)
    path = write_events(tmp_path / "t.json", AWKWARD)
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply(_host_ops_read_in, (path,)) == len(reference_timeline(path).host_ops)


def test_blocks_go_to_the_workers_through_shared_memory_or_the_pipe(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks are handed over in the shared ring (text far from ASCII included); one too large
    for a slot goes through the pool's pipe: the timeline is the same either way."""
    from doctor.trace import parallel

    handed: list[str] = []
    real = parallel._Slots.hand

    def hand(self: Any, text: str) -> Any:
        got = real(self, text)
        handed.append("ring" if isinstance(got, tuple) else "pipe")
        return got

    monkeypatch.setattr(parallel._Slots, "hand", hand)
    monkeypatch.setattr(reader, "BLOCK_CHARS", 512)
    monkeypatch.setattr(parallel, "SLOT_BYTES", 800)  # some blocks fit, some do not
    events = [{"ph": "X", "cat": "cpu_op", "name": f"aten::ünïcödé_名前_{k % 7}" * (1 + k % 5),
               "ts": 10 * k, "dur": 5, "tid": 1 + k % 3} for k in range(400)]
    events += [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}",
                "ts": 1000 * s, "dur": 1000, "tid": 1} for s in range(4)]
    path = write_events(tmp_path / "t.json", events)
    assert_same_timeline(load_timeline_parallel(path, 2), reference_timeline(path))
    assert "ring" in handed and "pipe" in handed


def test_rows_computed_once_per_key_are_found_for_many_keys_at_once() -> None:
    from doctor.trace.distinct_rows import Rows

    rows = Rows(2)
    assert rows.find(np.array([5, 7])).tolist() == [-1, -1]
    at = rows.add(np.array([7, 3]), [(70, 71), (30, 31)])
    assert at.tolist() == [0, 1]
    rows.add(np.array([5]), [(50, 51)])
    found = rows.find(np.array([3, 4, 5, 7, 8]))
    assert found.tolist() == [1, -1, 2, 0, -1]
    assert rows.rows[found[found >= 0]].tolist() == [[30, 31], [50, 51], [70, 71]]
    assert rows.table([]).shape == (0, 2)
