"""Typed events decoded a block at a time (doctor.trace.typed_events, TraceStream.blocks): the same
events as the standard library's, whatever falls on a block's edge, and the same timeline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from doctor.trace import reader
from doctor.trace.events import build_timeline, load_timeline
from doctor.trace.reader import TraceError, TraceStream
from doctor.trace.typed_events import ARG_KEYS, READER, Event, from_dict
from tests.trace_files import CLEAN, TRICKY, write_events


def fields(ev: Event) -> tuple[Any, ...]:
    args = ev.args
    return (ev.ph, ev.cat, ev.name, ev.ts, ev.dur, ev.tid,
            None if args is None else tuple(args.get(k) for k in ARG_KEYS))


def test_the_typed_decoder_and_the_gunzip_are_the_c_ones() -> None:
    assert READER == "msgspec"
    assert reader.GUNZIP == "isal"


def test_the_c_scanner_and_nesting_are_built_where_a_compiler_is() -> None:
    """pip builds doctor/trace/_scan.c and _nest.c where a C compiler and the Python headers
    are (optional: an install without them goes on, and the tests of the C parts skip); here,
    with both, a build that failed must not pass unnoticed."""
    import shutil
    import sysconfig

    from doctor.trace import ops, scan

    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not shutil.which(compiler) or not headers.is_file():
        pytest.skip(f"no C compiler ({compiler}) or no Python headers here")
    assert scan.AVAILABLE, "doctor/trace/_scan.c was not built (pip install -e . builds it)"
    assert ops._nest is not None, "doctor/trace/_nest.c was not built"


@pytest.mark.parametrize("block", [16, 64, 257, 1 << 20])
@pytest.mark.parametrize("layout", ["object", "bare", "indented", "gz"])
@pytest.mark.parametrize("kinds", ["clean", "unusual"])
def test_blocks_give_the_standard_library_s_events(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   block: int, layout: str, kinds: str) -> None:
    monkeypatch.setattr(reader, "BLOCK_CHARS", block)
    typed_blocks = []
    decode = reader.decode_block

    def counting(text: str) -> list[Event] | None:
        found = decode(text)
        typed_blocks.append(found is not None and all(type(e) is Event for e in found))
        return found

    monkeypatch.setattr(reader, "decode_block", counting)
    events = (CLEAN if kinds == "clean" else TRICKY) * 7
    path = write_events(tmp_path / "t.json", events, bare=layout == "bare", gz=layout == "gz",
                        indent=2 if layout == "indented" else None)
    stream = TraceStream(path, chunk_chars=max(8, block // 2))
    typed = [ev for chunk in stream.blocks() for ev in chunk]
    assert [fields(ev) for ev in typed] == [fields(from_dict(ev)) for ev in events]
    assert stream.event_count == len(events)
    if block >= 257:  # blocks hold several events: decoded as blocks, not one by one
        assert typed_blocks and any(typed_blocks)
    if layout != "bare":
        assert stream.meta.base_time_ns == 1_700_000_000_000_000_000


def test_a_truncated_trace_is_one_line_in_blocks_too(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader, "BLOCK_CHARS", 200)
    text = json.dumps({"traceEvents": TRICKY * 40})
    path = tmp_path / "cut.json"
    path.write_text(text[: len(text) // 2])
    with pytest.raises(TraceError) as err:
        for _ in TraceStream(path, chunk_chars=100).blocks():
            pass
    assert "\n" not in str(err.value) and "cut.json" in str(err.value)


def test_the_timeline_from_blocks_is_the_one_from_dicts(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader, "BLOCK_CHARS", 300)
    events = TRICKY * 30
    blocks = load_timeline(write_events(tmp_path / "t.json", events))
    dicts = build_timeline(events)
    for kind in ("host_ops", "kernels", "runtime", "memcpy", "memory"):
        a, b = getattr(blocks, kind), getattr(dicts, kind)
        assert len(a) > 0, kind
        np.testing.assert_array_equal(a.start, b.start)
        np.testing.assert_array_equal(a.end, b.end)
        for key in a.attrs:
            np.testing.assert_array_equal(a.attrs[key], b.attrs[key], err_msg=f"{kind}.{key}")
    assert blocks.steps == dicts.steps and blocks.names == dicts.names


def test_several_traces_read_in_parallel_come_back_in_order(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    from doctor.trace import tables

    monkeypatch.setattr(tables, "PARALLEL_BYTES", 0)
    files = []
    for rank in range(3):
        events = [dict(ev, ts=ev["ts"] + rank * 1000) if isinstance(ev.get("ts"), int) else ev
                  for ev in CLEAN * (rank + 1)]
        files.append(write_events(tmp_path / f"rank-{rank}.json", events))
    serial = tables.read_timelines(files, workers=1)
    parallel = tables.read_timelines(files, workers=3)
    assert [len(t.host_ops) for t in parallel] == [len(t.host_ops) for t in serial] == [1, 2, 3]
    for a, b in zip(serial, parallel, strict=True):
        np.testing.assert_array_equal(a.host_ops.start, b.host_ops.start)
        assert a.origin_us == b.origin_us and a.names == b.names
