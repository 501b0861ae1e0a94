"""run.json and meta.json read back through their one parser each (doctor.store.run_json,
doctor.store.process_meta): what the doors write reads back whole, a record of another format
is refused in one line, a field of another type is as good as absent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from doctor.errors import RunDirError, RunFormatError
from doctor.job_record import RunEnd, run_record
from doctor.store import layout
from doctor.store.process_meta import ProcessMeta, read_meta
from doctor.store.run_json import RunJson, read_run_json
from doctor.store.rundir import write_run_record
from doctor.verdict import ProbeStatus


def test_what_doctor_run_writes_reads_back_field_by_field(tmp_path: Path) -> None:
    probes = {"host": ProbeStatus(True), "gpu": ProbeStatus(False, "no NVML", "hint")}
    end = RunEnd(137, 2.5, probes, signal=9, fd_handoff_s=0.001, peaks={"cpu": {"x": 1.0}},
                 links={"nic": "eth0"}, deaths=[{"pid": 3, "signal": 9}], timed_out=True,
                 sampler_cpu_s=0.25)
    record = run_record(["python", "train.py"], "train", 0.0, 12.5, cwd="/work",
                        env={"OMP_NUM_THREADS": "4"}, **end.to_dict())
    write_run_record(tmp_path, record)
    run = read_run_json(tmp_path)
    assert run.schema == layout.FORMAT and run.argv == ("python", "train.py")
    assert (run.argv_fault, run.name, run.cwd, run.cwd_fault) == ("", "train", "/work", False)
    assert run.env == {"OMP_NUM_THREADS": "4"} and run.t0_monotonic_s == 12.5
    assert (run.host, run.cores, run.memory_bytes, run.python, run.doctor_version) == (
        record["host"], record["cores"], record["memory_bytes"], record["python"],
        record["doctor_version"])
    assert (run.exit_code, run.ended, run.signal, run.duration_s) == (137, True, 9, 2.5)
    assert run.probes == probes and run.fd_handoff_s == 0.001
    assert run.peaks == {"cpu": {"x": 1.0}} and run.links == {"nic": "eth0"}
    assert run.deaths == ({"pid": 3, "signal": 9},) and run.timed_out
    assert run.mode is None and run.sampler_cpu_s == 0.25 and run.started == record["started"]


def test_a_record_of_another_format_or_none_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match="is not a doctor run directory"):
        read_run_json(tmp_path)
    for doc, error, said in (([1, 2], RunDirError, "schema None"),
                             ({"schema": 3}, RunDirError, "schema 3"),
                             ({"schema": "doctor.run/0"}, RunFormatError, "record the job again")):
        (tmp_path / layout.RUN_RECORD).write_text(json.dumps(doc))
        with pytest.raises(error, match=said) as err:
            read_run_json(tmp_path)
        assert "\n" not in str(err.value)


def test_a_field_of_another_type_is_absent_and_a_command_says_what_is_wrong() -> None:
    def read(**fields: object) -> RunJson:
        return RunJson.from_dict({"schema": layout.FORMAT, **fields}, Path("run"))

    assert read().argv == () and read().argv_fault == "" and read().name == "job"
    assert read(argv=["python", 3]).argv == ("python", "3")
    assert [read(argv=v).argv_fault for v in (["a"], ["a", 1], "", 0, "text", {"a": 1})] == [
        "", "not text", "empty", "empty", "not a list", "not a list"]
    odd = read(cwd=1, env=[], host=2, cores=0, exit_code="x", duration_s=True, peaks=[],
               deaths=[{"pid": 1}, 2], probes={"a": {"ok": 1}, "b": 2}, timed_out=1, mode=3)
    assert odd.cwd is None and odd.cwd_fault and odd.env is None and odd.host is None
    assert odd.cores is None and odd.exit_code is None and odd.ended  # an exit status was said
    assert odd.duration_s is None and odd.peaks is None and odd.deaths == ({"pid": 1},)
    assert odd.probes == {"a": ProbeStatus(False)} and not odd.timed_out and odd.mode is None


def test_meta_json_reads_back_each_key_the_job_writes(tmp_path: Path) -> None:
    written = {
        "pid": 12, "ppid": 1, "rank": 0, "role": "main", "argv": ["train.py"], "local_rank": 0,
        "world_size": 2, "host": "h", "started_ns": 5, "cores": 8,
        "probes": {"torch_ops": {"ok": False, "reason": "r", "hint": "h"}},
        "torch_version": "2.13", "torch_threads": 4, "cuda": False, "ended_ns": 9,
        "rings": {"steps": 3}, "cuda_initialized": True, "cuda_device": 0, "cuda_uuid": "GPU-1",
        "stopped": {"memory.jsonl": "stopped: full"}, "crashed": "ValueError: x",
        "crashed_ns": 8, "probe_error": "E: y", "loaders": [{"id": 1, "num_workers": 2}],
        "batch_tensors": {"1": 3}, "window": {"state": "closed"}, "ddp": [{"backend": "gloo"}],
        "model_state": {"exit": {"rows": []}}, "saved_tensors": {"steps": [[1, 2]]},
        "memory_at_start": {"t_ns": 1}, "memory_at_end": {"t_ns": 2},
        "tried": {"env.X": {"tried": "1"}}, "tried_errors": ["e"], "stopped_at_step": 4,
        "stopped_ns": 7}
    proc = tmp_path / "rank-0" / "main-12"
    proc.mkdir(parents=True)
    (proc / layout.META).write_text(json.dumps(written))
    meta = read_meta(proc)
    as_read = {k: getattr(meta, k) for k in written}
    as_read["argv"], as_read["loaders"], as_read["ddp"], as_read["tried_errors"] = (
        list(meta.argv), list(meta.loaders), list(meta.ddp), list(meta.tried_errors))
    as_read["probes"] = {k: s.to_dict() for k, s in meta.probes.items()}
    assert as_read == written


def test_meta_json_fields_of_another_type_are_absent_and_an_unreadable_one_is_said(
        tmp_path: Path) -> None:
    odd = ProcessMeta.from_dict({"ppid": True, "world_size": "2", "cuda": 1, "window": [],
                                 "loaders": [{"id": 1}, 2], "tried_errors": "ab", "rank": 1.5})
    assert odd.ppid is None and odd.world_size is None and odd.cuda is None
    assert odd.window == {} and odd.loaders == ({"id": 1},) and odd.tried_errors == ()
    assert odd.rank is None
    assert read_meta(tmp_path) == ProcessMeta()  # a process killed at birth: none written
    (tmp_path / layout.META).write_text("[1]")
    problems: list[str] = []
    assert read_meta(tmp_path, problems) == ProcessMeta()
    assert len(problems) == 1 and problems[0].endswith("not an object: left out")


def test_doctor_trys_notes_take_a_meta_json_of_odd_types_as_absent(tmp_path: Path) -> None:
    """A process's ``tried`` that is not an object, or ``tried_errors`` that is not a list, is
    as good as absent (it raised AttributeError or TypeError before meta.json had one reader)."""
    from doctor.store.tries import process_notes

    for odd in ({"tried": [1], "tried_errors": 5}, {"tried": "x", "tried_errors": "ab"}):
        proc = tmp_path / "rank-0" / "main-12"
        proc.mkdir(parents=True, exist_ok=True)
        (proc / layout.META).write_text(json.dumps({**odd, "stopped_at_step": 3}))
        notes = process_notes(tmp_path)
        assert (notes["tried"], notes["errors"], notes["stopped"], notes["pids"]) == (
            {}, [], True, [12])


def test_the_progress_line_never_reads_a_meta_json_through_a_link(tmp_path: Path) -> None:
    """A failed window's reason comes from the process's own meta.json, read as every file of a
    run directory is (doctor.store.readback): a link planted at its name is not followed."""
    from doctor.progress import ProcessWindow, WindowProgress

    proc = tmp_path / "rank-0" / "main-12"
    proc.mkdir(parents=True)
    outside = tmp_path.parent / f"{tmp_path.name}-outside.json"
    outside.write_text(json.dumps({"window": {"reason": "read through a link"}}))
    (proc / layout.META).symlink_to(outside)
    progress = WindowProgress(tmp_path, lambda line: None)
    assert progress._reason_of(ProcessWindow(0, 12, "failed")) == ""
    (proc / layout.META).unlink()
    (proc / layout.META).write_text(json.dumps({"window": {"reason": "no CUPTI"}}))
    assert progress._reason_of(ProcessWindow(0, 12, "failed")) == "no CUPTI"
