"""The classifier and the io/decode/preprocess attribution, on recorded stack samples."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from doctor.analyse.frames import MAIN_SCOPE, WORKER_SCOPE, classify, load_rules
from doctor.analyse.split import StageSplit, rank_split
from doctor.analyse.steps import training_processes
from doctor.errors import FrameRulesError
from doctor.probes.stacks import PySpyRecorder
from doctor.store.control import in_process_stacks
from doctor.store.reader import load_run
from doctor.store.stacks import StackSamples, parse_raw, read_stacks
from tests.support import LOADER_MAIN_STACK, ROOT, record_loop, write_record

WORKER = ("_worker_loop (torch/utils/data/_utils/worker.py:349)",
          "_MapDatasetFetcher.fetch (torch/utils/data/_utils/fetch.py:52)")


def test_decoders_are_decode() -> None:
    stack = (*LOADER_MAIN_STACK, "Dataset.__getitem__ (train.py:30)",
             "Image.convert (PIL/Image.py:995)",
             "ImageFile.load (PIL/ImageFile.py:300)")
    assert classify(stack, MAIN_SCOPE) == ("decode", "ImageFile.load (PIL/ImageFile.py:300)")


@pytest.mark.parametrize("frames", [
    # torchvision's v1 transforms on a PIL image: Pillow does the work, but no decoding
    ("Resize.forward (torchvision/transforms/transforms.py:354)",
     "resize (torchvision/transforms/functional.py:479)",
     "resize (torchvision/transforms/_functional_pil.py:250)",
     "Image.resize (PIL/Image.py:2300)"),
    ("ColorJitter.forward (torchvision/transforms/transforms.py:1280)",
     "adjust_brightness (torchvision/transforms/_functional_pil.py:60)",
     "_Enhance.enhance (PIL/ImageEnhance.py:40)"),
    # Pillow called directly on an image in memory: a crop, a conversion, a filter
    ("Image.crop (PIL/Image.py:1300)",),
    ("Image.convert (PIL/Image.py:995)",),
    ("Image.filter (PIL/Image.py:1400)", "GaussianBlur.filter (PIL/ImageFilter.py:180)"),
])
def test_pillows_transforms_are_preprocess_not_decode(frames: tuple[str, ...]) -> None:
    stack = (*WORKER, "Dataset.__getitem__ (train.py:30)", *frames)
    assert classify(stack, WORKER_SCOPE)[0] == "preprocess"  # type: ignore[index]


@pytest.mark.parametrize("frame", [
    "ImageFile.load (PIL/ImageFile.py:300)",  # convert() of an image not yet loaded
    "JpegImageFile.draft (PIL/JpegImagePlugin.py:450)",
    "PngStream.call (PIL/PngImagePlugin.py:200)",
    "open (PIL/Image.py:3400)",
])
def test_pillows_codec_is_decode(frame: str) -> None:
    stack = (*WORKER, "Dataset.__getitem__ (train.py:30)", "Image.convert (PIL/Image.py:995)",
             frame)
    assert classify(stack, WORKER_SCOPE)[0] == "decode"  # type: ignore[index]


def test_innermost_rule_wins_so_reads_inside_a_decoder_are_io() -> None:
    stack = (*WORKER, "Dataset.__getitem__ (train.py:30)", "Image.open (PIL/Image.py:3400)",
             "FileIO.readinto (socket.py:700)")
    assert classify(stack, WORKER_SCOPE)[0] == "io"  # type: ignore[index]


def test_numpy_and_torch_loaders_are_io() -> None:
    for frame in ("load (numpy/lib/_npyio_impl.py:455)", "load (torch/serialization.py:1400)"):
        assert classify((*WORKER, "ds.__getitem__ (x.py:1)", frame), WORKER_SCOPE)[0] == "io"  # type: ignore[index]


def test_collate_and_unknown_user_code_are_preprocess() -> None:
    collate = (*WORKER, "default_collate (torch/utils/data/_utils/collate.py:398)")
    assert classify(collate, WORKER_SCOPE)[0] == "preprocess"  # type: ignore[index]
    user = (*WORKER, "MyDataset.__getitem__ (/home/me/train.py:30)", "augment (/home/me/aug.py:9)")
    assert classify(user, WORKER_SCOPE) == ("preprocess", "augment (/home/me/aug.py:9)")


def test_calls_into_c_are_classified_by_their_source_line(tmp_path: Path) -> None:
    src = tmp_path / "ds.py"
    src.write_text(textwrap.dedent("""\
        def get(path):
            raw = np.fromfile(path, dtype=np.uint8)
            img = cv2.imdecode(raw, 1)
            return img * 2
    """))
    at = lambda line: (*WORKER, f"get ({src}:{line})")  # noqa: E731
    assert classify(at(2), WORKER_SCOPE)[0] == "io"  # type: ignore[index]
    assert classify(at(3), WORKER_SCOPE)[0] == "decode"  # type: ignore[index]
    assert classify(at(4), WORKER_SCOPE)[0] == "preprocess"  # type: ignore[index]


def test_samples_outside_loading_and_doctors_own_are_set_apart() -> None:
    assert classify(("<module> (train.py:1)", "forward (model.py:3)"), MAIN_SCOPE) is None
    own = (*LOADER_MAIN_STACK, "Session.record_interval (doctor/record/session.py:166)")
    assert classify(own, MAIN_SCOPE)[0] == "doctor"  # type: ignore[index]


def test_extra_rules_extend_the_table_without_code(tmp_path: Path) -> None:
    extra = tmp_path / "rules.json"
    extra.write_text(json.dumps({"rules": [
        {"category": "decode", "function": "^parse_record$"}]}))
    rules = load_rules([extra, ROOT / "doctor/analyse/data/input_frames.json"])
    stack = (*WORKER, "parse_record (/srv/mydata.py:10)")
    assert classify(stack, WORKER_SCOPE, rules)[0] == "decode"  # type: ignore[index]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rules": [{"category": "network", "file": "x"}]}))
    with pytest.raises(FrameRulesError, match="unknown category"):
        load_rules([bad])
    bad.write_text('{"rules": [{"category": "decode", "function": "(unclosed"}]}')
    with pytest.raises(FrameRulesError, match="not a regular expression"):
        load_rules([bad])


def samples(stacks: dict, rate_hz: float = 50.0) -> StackSamples:  # type: ignore[type-arg]
    taken = sum(stacks.values())
    return StackSamples(stacks, "py-spy", rate_hz, (0, int(taken / rate_hz * 1e9)), taken)


def test_loading_is_split_by_sample_counts_running_or_blocked() -> None:
    # 160 samples in a read (most of them blocked on storage), 40 decoding: 80 % io
    split = StageSplit()
    decode = (*WORKER, "ImageFile.load (PIL/ImageFile.py:300)")
    read = (*WORKER, "Dataset.__getitem__ (train.py:30)", "FileIO.readinto (socket.py:700)")
    split.add(samples({decode: 40, read: 160}), scope=WORKER_SCOPE)
    assert split.fractions == pytest.approx({"io": 0.8, "decode": 0.2, "preprocess": 0.0})
    assert split.seconds["io"] == pytest.approx(160 / 50)


def test_samples_outside_the_loading_scope_do_not_count() -> None:
    split = StageSplit()
    decode = (*WORKER, "ImageFile.load (PIL/ImageFile.py:300)")
    aug = (*WORKER, "MyDataset.__getitem__ (/x/train.py:30)")
    idle_wait = ("_worker_loop (torch/utils/data/_utils/worker.py:300)", "Queue.get (q.py:1)")
    split.add(samples({decode: 60, aug: 90, idle_wait: 500}), scope=WORKER_SCOPE)
    assert split.fractions == pytest.approx({"io": 0.0, "decode": 0.4, "preprocess": 0.6})


def test_a_read_inside_a_decoder_is_io_by_its_source_line(tmp_path: Path) -> None:
    # PIL's own frames are decode, except the line that reads the file
    lib = tmp_path / "site-packages" / "PIL"
    lib.mkdir(parents=True)
    plugin = lib / "PngImagePlugin.py"
    plugin.write_text("def load_read(self, n):\n    return self.fp.read(n)\n"
                      "def load(self):\n    n, err = decoder.decode(b)\n")
    reading = (*WORKER, "Dataset.__getitem__ (/x/train.py:30)", f"load_read ({plugin}:2)")
    decoding = (*WORKER, "Dataset.__getitem__ (/x/train.py:30)", f"load ({plugin}:4)")
    assert classify(reading, WORKER_SCOPE)[0] == "io"  # type: ignore[index]
    assert classify(decoding, WORKER_SCOPE)[0] == "decode"  # type: ignore[index]


def test_rank_split_reads_the_main_process_samples(tmp_path: Path) -> None:
    main = record_loop(tmp_path, 30, wait_s=0.08, compute_s=0.02).directory
    decode = (*LOADER_MAIN_STACK, "ImageFile.load (PIL/ImageFile.py:300)")
    compute = ("<module> (train.py:80)", "forward (model.py:3)")
    (main / "stacks.txt").write_text(f"{';'.join(decode)} 80\n{';'.join(compute)} 20\n")
    (main / "stacks.json").write_text(json.dumps(
        {"recorder": "py-spy", "rate_hz": 50, "start_ns": 0, "end_ns": int(2e9), "taken": 100}))
    write_record(tmp_path)
    run = load_run(tmp_path)
    [trained] = training_processes(run).values()
    split = rank_split(run, trained)
    assert split.fractions == pytest.approx({"io": 0.0, "decode": 1.0, "preprocess": 0.0})


def test_only_the_main_thread_of_a_process_is_kept(tmp_path: Path) -> None:
    proc_dir = tmp_path / "main-4242"
    proc_dir.mkdir()
    (proc_dir / "stacks.txt").write_text(
        "thread (4242): MainThread;<module> (train.py:1);busy (train.py:5) 30\n"
        "thread (4250): pin_memory;_pin_memory_loop (pin_memory.py:9);get (queue.py:3) 70\n"
        "thread (4242): MainThread 25\n")  # the interpreter shutting down: no Python frame
    (proc_dir / "stacks.json").write_text(json.dumps(
        {"recorder": "py-spy", "rate_hz": 50, "start_ns": 0, "end_ns": int(2e9), "taken": 100}))
    got = read_stacks(proc_dir)
    assert got is not None
    assert got.stacks == {("<module> (train.py:1)", "busy (train.py:5)"): 30}


def test_parse_raw_keeps_counts_of_repeated_stacks() -> None:
    text = "a (x.py:1);b (y.py:2) 3\na (x.py:1);b (y.py:2) 2\nbroken line\n"
    assert parse_raw(text) == {("a (x.py:1)", "b (y.py:2)"): 5}


def test_missing_py_spy_falls_back_at_once(tmp_path: Path) -> None:
    recorder = PySpyRecorder(tmp_path, py_spy="")
    recorder.start()
    assert in_process_stacks(tmp_path)
    assert "py-spy is not installed" in recorder.check().reason
