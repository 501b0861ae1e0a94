"""The classifier and the io/decode/preprocess attribution, on recorded stack samples."""

from __future__ import annotations

import json
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from doctor.input_split import (
    _MAIN_SCOPE,
    _WORKER_SCOPE,
    StageSplit,
    classify,
    load_rules,
    rank_split,
)
from doctor.probes.stacks import (
    MODE_FILE,
    InProcessSampler,
    PySpyRecorder,
    StackSamples,
    fallback_requested,
    parse_raw,
    read_stacks,
)
from doctor.rundir import list_processes
from tests.loops import record_loop

MAIN = ("<module> (train.py:80)", "main (train.py:67)",
        "__next__ (probes/dataloader.py:72)",
        "_BaseDataLoaderIter.__next__ (torch/utils/data/dataloader.py:725)",
        "_SingleProcessDataLoaderIter._next_data (torch/utils/data/dataloader.py:785)",
        "fetch (probes/dataloader.py:115)",
        "_MapDatasetFetcher.fetch (torch/utils/data/_utils/fetch.py:52)")
WORKER = ("_worker_loop (torch/utils/data/_utils/worker.py:349)",
          "_MapDatasetFetcher.fetch (torch/utils/data/_utils/fetch.py:52)")


def test_decoders_are_decode() -> None:
    stack = (*MAIN, "Dataset.__getitem__ (train.py:30)", "Image.convert (PIL/Image.py:995)",
             "ImageFile.load (PIL/ImageFile.py:300)")
    assert classify(stack, _MAIN_SCOPE) == ("decode", "ImageFile.load (PIL/ImageFile.py:300)")


def test_innermost_rule_wins_so_reads_inside_a_decoder_are_io() -> None:
    stack = (*WORKER, "Dataset.__getitem__ (train.py:30)", "Image.open (PIL/Image.py:3400)",
             "FileIO.readinto (socket.py:700)")
    assert classify(stack, _WORKER_SCOPE)[0] == "io"  # type: ignore[index]


def test_numpy_and_torch_loaders_are_io() -> None:
    for frame in ("load (numpy/lib/_npyio_impl.py:455)", "load (torch/serialization.py:1400)"):
        assert classify((*WORKER, "ds.__getitem__ (x.py:1)", frame), _WORKER_SCOPE)[0] == "io"  # type: ignore[index]


def test_collate_and_unknown_user_code_are_preprocess() -> None:
    collate = (*WORKER, "default_collate (torch/utils/data/_utils/collate.py:398)")
    assert classify(collate, _WORKER_SCOPE)[0] == "preprocess"  # type: ignore[index]
    user = (*WORKER, "MyDataset.__getitem__ (/home/me/train.py:30)", "augment (/home/me/aug.py:9)")
    assert classify(user, _WORKER_SCOPE) == ("preprocess", "augment (/home/me/aug.py:9)")


def test_calls_into_c_are_classified_by_their_source_line(tmp_path: Path) -> None:
    src = tmp_path / "ds.py"
    src.write_text(textwrap.dedent("""\
        def get(path):
            raw = np.fromfile(path, dtype=np.uint8)
            img = cv2.imdecode(raw, 1)
            return img * 2
    """))
    at = lambda line: (*WORKER, f"get ({src}:{line})")  # noqa: E731
    assert classify(at(2), _WORKER_SCOPE)[0] == "io"  # type: ignore[index]
    assert classify(at(3), _WORKER_SCOPE)[0] == "decode"  # type: ignore[index]
    assert classify(at(4), _WORKER_SCOPE)[0] == "preprocess"  # type: ignore[index]


def test_samples_outside_loading_and_doctors_own_are_set_apart() -> None:
    assert classify(("<module> (train.py:1)", "forward (model.py:3)"), _MAIN_SCOPE) is None
    own = (*MAIN, "Session.record_interval (doctor/session.py:166)")
    assert classify(own, _MAIN_SCOPE)[0] == "doctor"  # type: ignore[index]


def test_extra_rules_extend_the_table_without_code(tmp_path: Path) -> None:
    extra = tmp_path / "rules.json"
    extra.write_text(json.dumps({"rules": [
        {"category": "decode", "function": "^parse_record$"}]}))
    rules = load_rules([extra, Path(__file__).parents[1] / "doctor/data/input_frames.json"])
    stack = (*WORKER, "parse_record (/srv/mydata.py:10)")
    assert classify(stack, _WORKER_SCOPE, rules)[0] == "decode"  # type: ignore[index]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rules": [{"category": "network", "file": "x"}]}))
    with pytest.raises(ValueError, match="unknown category"):
        load_rules([bad])


def samples(stacks: dict, taken: int, span_s: float = 4.0) -> StackSamples:  # type: ignore[type-arg]
    return StackSamples(stacks, "py-spy", 50.0, (0, int(span_s * 1e9)), taken)


def test_blocked_loading_time_is_io() -> None:
    # loading fills the whole 4 s span, but only 40 of 200 samples were running (decoding)
    split = StageSplit()
    decode = (*WORKER, "ImageFile.load (PIL/ImageFile.py:300)")
    split.add(samples({decode: 40}, taken=200), loading=(4.0, 4.0), scope=_WORKER_SCOPE)
    assert split.fractions == pytest.approx({"io": 0.8, "decode": 0.2, "preprocess": 0.0})
    assert split.blocked_s == pytest.approx(3.2)


def test_running_loading_is_split_by_frames() -> None:
    split = StageSplit()
    decode = (*WORKER, "ImageFile.load (PIL/ImageFile.py:300)")
    aug = (*WORKER, "MyDataset.__getitem__ (/x/train.py:30)")
    idle_wait = ("_worker_loop (torch/utils/data/_utils/worker.py:300)", "Queue.get (q.py:1)")
    split.add(samples({decode: 60, aug: 90, idle_wait: 50}, taken=200), loading=(3.0, 4.0),
              scope=_WORKER_SCOPE)
    assert split.fractions == pytest.approx({"io": 0.0, "decode": 0.4, "preprocess": 0.6})


def test_rank_split_reads_the_main_process_samples(tmp_path: Path) -> None:
    clock = record_loop(tmp_path, 30, wait_s=0.08, compute_s=0.02).clock
    [main] = list_processes(tmp_path)
    decode = (*MAIN, "ImageFile.load (PIL/ImageFile.py:300)")
    (main.path / "stacks.txt").write_text(f"{';'.join(decode)} 100\n")
    end = clock()
    start = end - int(2e9)
    (main.path / "stacks.json").write_text(json.dumps(
        {"recorder": "py-spy", "rate_hz": 50, "start_ns": start, "end_ns": end, "taken": 100}))
    split = rank_split(main, [main])
    # 80 % of the span was spent loading, and all 100 samples were active decoding...
    # ...so loading is all decode, nothing blocked
    assert split.fractions is not None
    assert split.fractions["decode"] > 0.95


def test_parse_raw_keeps_counts_of_repeated_stacks() -> None:
    text = "a (x.py:1);b (y.py:2) 3\na (x.py:1);b (y.py:2) 2\nbroken line\n"
    assert parse_raw(text) == {("a (x.py:1)", "b (y.py:2)"): 5}


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


def test_in_process_sampler_records_the_running_thread(tmp_path: Path) -> None:
    sampler = InProcessSampler(tmp_path, threading.get_ident(), threading.get_native_id(),
                               rate_hz=100, span_s=0.3)
    sampler.start()
    busy(0.6)
    sampler._thread.join(timeout=5)
    got = read_stacks(tmp_path)
    assert got is not None and got.recorder == "in-process"
    assert got.taken > 0
    in_busy = sum(n for s, n in got.stacks.items() if s[-1].startswith("busy "))
    assert in_busy >= 0.5 * got.active


def fake_py_spy(tmp_path: Path, body: str) -> str:
    path = tmp_path / "py-spy"
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return str(path)


def test_refused_ptrace_falls_back_to_the_in_process_sampler(tmp_path: Path) -> None:
    spy = fake_py_spy(tmp_path, """
        import sys
        print("Error: Permission denied (os error 1)", file=sys.stderr)
        sys.exit(1)
    """)
    recorder = PySpyRecorder(tmp_path, py_spy=spy)
    deadline = time.monotonic() + 30
    while not fallback_requested(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)  # the ptrace check runs in a thread: wait for its answer
    assert fallback_requested(tmp_path)
    assert "Permission denied" in json.loads((tmp_path / MODE_FILE).read_text())["reason"]
    status = recorder.check()
    assert status.ok and "in-process sampler" in status.reason
    assert "SYS_PTRACE" in status.hint


def test_missing_py_spy_falls_back_at_once(tmp_path: Path) -> None:
    recorder = PySpyRecorder(tmp_path, py_spy="")
    assert fallback_requested(tmp_path)
    assert "py-spy is not installed" in recorder.check().reason


def test_a_sampler_that_outlives_the_loading_is_cut_at_its_end(tmp_path: Path) -> None:
    # a 4 s span, but the job's last batch ended 2 s in: the samples cover those 2 s
    clock = record_loop(tmp_path, 20, wait_s=0.08, compute_s=0.02).clock
    [main] = list_processes(tmp_path)
    from doctor.input_split import loading_seconds

    end = clock()
    loading, span = loading_seconds(main, "loader_wait", (end - int(2e9), end + int(2e9)))
    assert span == pytest.approx(1.98, abs=0.001)  # the last wait ended 0.02 s before the end
    assert loading / span == pytest.approx(0.8, abs=0.05)


def test_samples_counted_after_the_process_ended_do_not_dilute_the_rest() -> None:
    # py-spy reports 200 samples over 4 s, but the process lived 2 s: 100 could be taken, and
    # all 100 were active decoding while the loader was busy the whole time
    split = StageSplit()
    decode = (*WORKER, "ImageFile.load (PIL/ImageFile.py:300)")
    split.add(samples({decode: 100}, taken=200), loading=(2.0, 2.0), scope=_WORKER_SCOPE)
    assert split.fractions == pytest.approx({"io": 0.0, "decode": 1.0, "preprocess": 0.0})


def test_samples_that_came_late_cover_the_end_of_the_span(tmp_path: Path) -> None:
    # waits fill the first half of a 4 s span and nothing the second; only 2 s of samples
    # came (py-spy attached late): they cover the last 2 s, where nothing was loading
    from doctor.input_split import loading_seconds
    from doctor.session import Session
    from tests.loops import FakeClock

    clock = FakeClock()
    s = Session(tmp_path, clock=clock, window_start=10**9)
    start = clock()
    s.record_interval("fetch", start, start + int(2e9))
    s.record_interval("fetch", start + int(3.9e9), start + int(4e9))
    s.close()
    [proc] = list_processes(tmp_path)
    loading, span = loading_seconds(proc, "fetch", (start, start + int(4e9)), sampled_s=2.0)
    assert span == pytest.approx(2.0)
    assert loading == pytest.approx(0.1)
