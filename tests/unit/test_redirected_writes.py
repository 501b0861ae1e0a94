"""Writes that cannot be redirected (issue 32): a symlink planted in a run directory (received,
or shared) where doctor writes (report.html, verdict.json, run.json and its temporary name,
timeline.json.gz, control.jsonl, the samples, the try record, the node records, the roofline
cache) is replaced or refused, never written through: the user's file it points at is left as
it was."""

from __future__ import annotations

import json
import os
from array import array
from pathlib import Path

import pytest

from doctor.store import layout
from doctor.store.control import post_window, read_control
from doctor.store.rundir import (
    gzip_traces,
    write_node_record,
    write_nodes_record,
    write_outputs,
    write_run_record,
)
from doctor.store.samples import (
    GPU_COLUMNS,
    GPU_PROC_COLUMNS,
    PROC_COLUMNS,
    SYSTEM_COLUMNS,
    save_gpu,
    save_host,
)
from doctor.store.tries import write_try
from doctor.store.try_record import TryRecord
from tests.support import VICTIM_TEXT, plant, regular


def columns(names: tuple[str, ...], rows: int = 2) -> dict[str, array]:
    return {c: array("d", [1.0] * rows) for c in names}


def test_the_parents_writers_replace_a_link_never_write_through_it(
        tmp_path: Path, victim: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    pid = os.getpid()
    names = [layout.RUN_RECORD, f"{layout.RUN_RECORD}.tmp", f".{layout.RUN_RECORD}.{pid}.0.tmp",
             layout.VERDICT, layout.REPORT, layout.NODE_RECORD, layout.NODES_RECORD,
             layout.TRY_RECORD, f"{layout.TRY_RECORD[:-5]}.tmp", layout.HOST, layout.GPU,
             layout.GPU_INFO, f".{layout.HOST}.{pid}.0.tmp"]
    plant(run_dir, names, victim)
    write_run_record(run_dir, {"argv": ["python", "x.py"]})
    write_outputs(run_dir, "{}", "<html></html>")
    write_node_record(run_dir, 0, 2, done=False)
    write_nodes_record(run_dir, {"nnodes": 2})
    write_try(run_dir, TryRecord(command=["python", "x.py", "--token", "T"]))
    save_host(run_dir, columns(PROC_COLUMNS), columns(SYSTEM_COLUMNS))
    save_gpu(run_dir, columns(GPU_COLUMNS), columns(GPU_PROC_COLUMNS), info=[{"name": "g"}])
    assert victim.read_text() == VICTIM_TEXT
    for name in (layout.RUN_RECORD, layout.VERDICT, layout.REPORT, layout.NODE_RECORD,
                 layout.NODES_RECORD, layout.TRY_RECORD, layout.HOST, layout.GPU,
                 layout.GPU_INFO):
        assert regular(run_dir / name), name
    assert json.loads((run_dir / layout.RUN_RECORD).read_text())["argv"] == ["python", "x.py"]
    assert json.loads((run_dir / layout.TRY_RECORD).read_text())["command"][-1] == "<redacted>"


def test_the_control_file_is_never_written_through_a_link(tmp_path: Path, victim: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    plant(run_dir, [layout.CONTROL], victim)
    with pytest.raises(OSError):
        post_window(run_dir, 0, 1, "active")
    assert victim.read_text() == VICTIM_TEXT
    (run_dir / layout.CONTROL).unlink()
    post_window(run_dir, 0, 1, "active")  # created here, exclusively, then appended to
    post_window(run_dir, 0, 1, "done")
    assert regular(run_dir / layout.CONTROL)
    assert read_control(run_dir).windows == {(0, 1): "done"}


def test_trace_compression_neither_reads_nor_writes_through_links(
        tmp_path: Path, victim: Path) -> None:
    linked = tmp_path / "run" / "rank-0" / "main-1"
    plain = tmp_path / "run" / "rank-0" / "main-2"
    linked.mkdir(parents=True)
    plain.mkdir(parents=True)
    (linked / layout.TRACE).symlink_to(victim)  # would copy the user's file into the run
    (plain / layout.TRACE).write_text('{"traceEvents": []}')
    (plain / layout.TRACE_GZ).symlink_to(victim)  # would overwrite the user's file
    gzip_traces(tmp_path / "run")
    assert victim.read_text() == VICTIM_TEXT
    assert (linked / layout.TRACE).is_symlink() and not (linked / layout.TRACE_GZ).exists()
    assert regular(plain / layout.TRACE_GZ) and not (plain / layout.TRACE).exists()


def test_the_roofline_cache_is_replaced_not_written_through(tmp_path: Path, victim: Path) -> None:
    from doctor.probes.peaks import machine_peaks

    python = tmp_path / "fake-python"
    python.write_text("#!/bin/sh\necho '{\"gemm_flops\": {\"float32\": 1.0}}'\n")
    python.chmod(0o755)
    cache = tmp_path / "cache" / "peaks.json"
    cache.parent.mkdir()
    cache.symlink_to(victim)
    cache.with_suffix(".tmp").symlink_to(victim)  # the temporary name of doctors before
    assert machine_peaks(str(python), cache) == {"gemm_flops": {"float32": 1.0}}
    assert victim.read_text() == VICTIM_TEXT and regular(cache)


