"""Run directories that are damaged, oddly typed, or planted: ``doctor report`` of one reports
(the damaged file left out with a note, the report marked partial) or refuses it in one line with
exit status 2; never a traceback, a hang, an unbounded read or a false "aborted".

A real run directory is made once (a small sample job under ``doctor run``); each case copies
it, changes one file (seeded, so the cases are the same on every run) and reports it in this
process, as ``doctor`` would: ``doctor.cli.main``. A FIFO left blocking is opened for writing by
a watchdog (so a hang is counted, not waited on forever), and the address space is capped while
the cases run (so a read of ``/dev/zero`` is a MemoryError counted, not the machine's memory).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import resource
import select
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from doctor import cli
from doctor.store import layout
from tests.support import MARKER_JOB, SAMPLE_JOBS, doctor_cmd

pytestmark = pytest.mark.e2e

SEED = 32
#: Values of the wrong type put in place of a JSON field (one of them per field, seeded).
WRONG = ([], ["x", 1], "text", None, {}, {"a": [1]}, -1, 1e308, True, "\udcff")
#: What is not a file of the run's own: never read, and said (the report is partial).
PLANTED = ("fifo", "dev_zero", "directory", "link_out", "link_out_fifo")
NESTED = 15  # fields inside a JSON file's objects and lists given a wrong value (seeded)
CHILD_S = 600.0  # the forked half's cases, all: past this it is stuck
HANG_S = 20.0  # a case still reading after this has hung (its FIFO is then opened to end it)
ADDRESS_SPACE_MARGIN = 3 << 30  # bytes the cases may map beyond what the process has


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small job's run directory, with the files a run may hold beside what this one wrote
    (a bootstrap error, allocator snapshots, what the GPU is)."""
    root = tmp_path_factory.mktemp("recorded")
    run_dir = root / "run"
    ran = doctor_cmd("run", "--quiet", "--out", str(run_dir), "--", sys.executable,
                     str(SAMPLE_JOBS / "compute_bound.py"), "--steps", "16", "--width", "256",
                     cwd=root, timeout=240)
    assert ran.returncode == 0, ran.stderr[-3000:]
    for name in ("verdict.json", "report.html", "timeline.json.gz", "control.jsonl"):
        (run_dir / name).unlink(missing_ok=True)  # written, not read
    (run_dir / "bootstrap-errors").mkdir(exist_ok=True)
    (run_dir / "bootstrap-errors" / "4242.txt").write_text("ImportError: no module named x\n")
    [proc] = [p for p in run_dir.glob("rank-0/main-*")]
    (proc / "memory.jsonl").write_text(json.dumps(
        {"t_ns": 1, "tag": "step", "device": 0, "allocated_bytes": 10.0,
         "reserved_bytes": 20.0, "step": 3}) + "\n")
    return run_dir


def files_of(run_dir: Path) -> list[str]:
    """The files of a run directory that the analysis reads (not the lock a recording run
    holds, doctor.store.claim: it is never read back)."""
    return sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*")
                  if p.is_file() and p.name != layout.RUN_LOCK)


Mutation = Callable[[Path, random.Random], None]


def _replace(path: Path, data: bytes) -> None:
    path.unlink()
    path.write_bytes(data)


def _flip(path: Path, rng: random.Random, within: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    if not data:  # an empty file (no stack samples taken on a loaded machine): one stray byte
        _replace(path, b"\xff")
        return
    for _ in range(8):
        i = rng.randrange(min(len(data), within or len(data)))
        data[i] ^= 0xFF
    _replace(path, bytes(data))


def _fifo(path: Path, rng: random.Random) -> None:
    path.unlink()
    os.mkfifo(path)


def _dev_zero(path: Path, rng: random.Random) -> None:
    path.unlink()
    path.symlink_to("/dev/zero")


def _directory(path: Path, rng: random.Random) -> None:
    path.unlink()
    path.mkdir()


COMMON: dict[str, Mutation] = {
    "empty": lambda p, r: _replace(p, b""),
    "half": lambda p, r: _replace(p, p.read_bytes()[: p.stat().st_size // 2]),
    "flip": _flip,
    "fifo": _fifo,
    "dev_zero": _dev_zero,
    "directory": _directory,
}
TEXT = (".json", ".jsonl", ".txt")
#: The rings whose header is damaged in every way (the others: flipped, cut, planted).
HEADERS = ("events.ring", "optimizer.ring")


def _json_cases(rel: str, doc: Any, rng: random.Random) -> dict[str, Mutation]:
    """The whole document, and each top-level field, replaced by values of the wrong type."""
    def put(value: Any) -> Mutation:
        return lambda p, r: _replace(p, json.dumps(value).encode("utf-8", "surrogatepass"))

    cases = {f"whole={w!r}": put(w) for w in ([1, 2], "text", None)}
    if isinstance(doc, dict):
        for key in doc:
            wrong = rng.choice(WRONG)
            cases[f"{key}={wrong!r}"] = put({**doc, key: wrong})
    nested = [p for p in _paths(doc) if len(p) > 1]
    for path in rng.sample(nested, min(NESTED, len(nested))):
        wrong = rng.choice(WRONG)
        cases[f"{'.'.join(map(str, path))}={wrong!r}"] = put(_put(doc, path, wrong))
    return cases


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Where a value sits in ``doc``: every key of every object, the first items of a list."""
    items = (doc.items() if isinstance(doc, dict) else
             enumerate(doc[:2]) if isinstance(doc, list) else ())
    for key, value in items:
        yield (*prefix, key)
        yield from _paths(value, (*prefix, key))


def _put(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    doc = json.loads(json.dumps(doc))
    inner = doc
    for key in path[:-1]:
        inner = inner[key]
    inner[path[-1]] = value
    return doc


def _ring_cases() -> dict[str, Mutation]:
    """The ring's header: a capacity past any file, a format and names that are not text."""
    def patch(offset: int, raw: bytes) -> Mutation:
        def mutate(p: Path, r: random.Random) -> None:
            data = bytearray(p.read_bytes())
            data[offset:offset + len(raw)] = raw
            _replace(p, bytes(data))
        return mutate

    return {"capacity": patch(8, struct.pack("<Q", 2**62)),
            "capacity0": patch(8, struct.pack("<Q", 0)),
            "format": patch(24, b"\xff\xfe<qq"), "names": patch(56, b"\xff,\xfe"),
            "header_flip": lambda p, r: _flip(p, r, within=256),
            "records_flip": lambda p, r: _flip(p, r, within=256 + 16 * 40)}


def _npz_cases(path: Path) -> dict[str, Mutation]:
    """Arrays of other lengths, of text, missing."""
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    first = sorted(arrays)[0]

    def save(changed: dict[str, Any]) -> Mutation:
        def mutate(p: Path, r: random.Random) -> None:
            buf = io.BytesIO()
            np.savez(buf, **changed)
            _replace(p, buf.getvalue())
        return mutate

    return {"short_column": save({**arrays, first: arrays[first][:1]}),
            "text_column": save({**arrays, first: np.array(["a"] * len(arrays[first]))}),
            "missing_column": save({k: v for k, v in arrays.items() if k != first}),
            "2d_column": save({**arrays, first: np.zeros((2, 2))})}


def cases(run_dir: Path) -> list[tuple[str, str, Mutation]]:
    """(file, mutation name, mutation) for every file of ``run_dir``."""
    rng = random.Random(SEED)
    out: list[tuple[str, str, Mutation]] = []
    for rel in files_of(run_dir):
        path = run_dir / rel
        mine: dict[str, Mutation] = dict(COMMON)
        for planted in ("link_out", "link_out_fifo"):  # made in mutate(): need the case's folder
            mine[planted] = lambda p, r: None
        if rel.endswith(TEXT):
            mine["not_utf8"] = lambda p, r: _replace(p, b"\xff\xfe" + p.read_bytes()[2:])
        if rel.endswith(".json"):
            mine.update(_json_cases(rel, json.loads(path.read_text()), rng))
        if rel.endswith(HEADERS):
            mine.update(_ring_cases())
        if rel.endswith(".npz"):
            mine.update(_npz_cases(path))
        if rel.endswith(".jsonl"):
            mine["line_list"] = lambda p, r: _replace(p, b"[1, 2]\n\"x\"\n{\"t_ns\": \"a\"}\n")
        out += [(rel, name, m) for name, m in mine.items()]
    return out


def mutate(case_dir: Path, rel: str, name: str, mutation: Mutation, rng: random.Random) -> None:
    path = case_dir / rel
    if name.startswith("link_out"):  # outside the directory: not to be followed (a FIFO
        outside = case_dir.parent / f"outside-{path.name}"  # there would hang a reader that did)
        if name == "link_out_fifo":
            os.mkfifo(outside)
        else:
            shutil.copyfile(path, outside)
        path.unlink()
        path.symlink_to(outside)
        return
    mutation(path, rng)


class Watchdog:
    """Opens every FIFO under ``root`` for writing once ``after_s`` has passed, so that a reader
    blocked on one returns (and the case is counted as a hang)."""

    def __init__(self, root: Path, after_s: float) -> None:
        self.fired = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(root, after_s), daemon=True,
                                        name="fuzz-watchdog")
        self._thread.start()

    def _run(self, root: Path, after_s: float) -> None:
        while not self._done.wait(after_s):
            self.fired = True
            for fifo in root.rglob("*"):
                if fifo.is_fifo():
                    with contextlib.suppress(OSError):
                        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                        os.close(fd)

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


@contextlib.contextmanager
def address_space_capped() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * resource.getpagesize()
    cap = mapped + ADDRESS_SPACE_MARGIN
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY
                                            else min(cap, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def report(run_dir: Path, out: Path, capsys: pytest.CaptureFixture[str] | None
           ) -> tuple[int | str, str]:
    """``doctor report --format json -o OUT RUN_DIR`` in this process: (exit status, or the
    exception that escaped as a traceback would; what it printed on stderr: from ``capsys``,
    or from sys.stderr, a StringIO, where it is None)."""
    argv = sys.argv
    if capsys is None:
        assert isinstance(sys.stderr, io.StringIO)
        sys.stderr.seek(0)
        sys.stderr.truncate()
    sys.argv = ["doctor", "report", "--format", "json", "-o", str(out), str(run_dir)]
    status: int | str = 0
    try:
        cli.main()
    except SystemExit as end:
        status = end.code if isinstance(end.code, int) else 1
    except BaseException as err:  # what a user would see as a traceback
        status = f"{type(err).__name__}: {str(err)[:200]}"
    finally:
        sys.argv = argv
    return status, (capsys.readouterr().err if capsys is not None else sys.stderr.getvalue())


def test_every_single_file_mutation_reports_or_is_refused_in_one_line(
        recorded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The cases split between this process and a forked child (CPU alone: two cores take
    half the time), each case as it would be in one process."""
    every = cases(recorded)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the odd cases; what failed back through the pipe, then gone at once
        os.close(read)
        code = 1
        try:
            with open(write, "w") as out, contextlib.redirect_stderr(io.StringIO()):
                json.dump(try_cases(every, 1, recorded, tmp_path / "odd", None), out)
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    failures = try_cases(every, 0, recorded, tmp_path / "even", capsys)
    theirs = read_within(read, CHILD_S)
    if theirs is None:  # a child stuck (a lock held at the fork): ended, and said
        os.kill(child, signal.SIGKILL)
    _, status = os.waitpid(child, 0)
    assert theirs is not None, f"the forked half did not finish in {CHILD_S:.0f} s"
    assert os.waitstatus_to_exitcode(status) == 0 and theirs, "the forked half failed"
    failures += json.loads(theirs)
    print(f"\n{len(every)} mutations of {len(files_of(recorded))} files tried, "
          f"{len(failures)} failed")
    assert not failures, f"{len(failures)} of {len(every)} mutations:\n" + "\n".join(failures)


def read_within(fd: int, seconds: float) -> str | None:
    """All of ``fd`` to its end, or None where it has not ended within ``seconds``."""
    chunks = []
    deadline = time.monotonic() + seconds
    with open(fd, "rb") as pipe:
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([pipe], [], [], left)[0]:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks).decode()
            chunks.append(chunk)
    return None


def try_cases(every: list[tuple[str, str, Mutation]], parity: int, recorded: Path,
              folder: Path, capsys: pytest.CaptureFixture[str] | None) -> list[str]:
    """Each case of ``every`` whose index has ``parity``, reported in this process: what
    failed. ``capsys`` None: stderr is already redirected (the forked child)."""
    failures: list[str] = []
    rng = random.Random(SEED)
    with address_space_capped():
        for i, (rel, name, mutation) in enumerate(every):
            case_rng = random.Random(rng.random())  # each case its own: both halves the same
            if i % 2 != parity:
                continue
            case_dir = folder / f"case{i}" / "run"
            shutil.copytree(recorded, case_dir, symlinks=True, copy_function=os.link)
            mutate(case_dir, rel, name, mutation, case_rng)
            out = folder / f"case{i}" / "verdict.json"
            watchdog = Watchdog(case_dir, HANG_S)
            try:
                status, err = report(case_dir, out, capsys)
            finally:
                watchdog.stop()
            what = f"{rel} {name}"
            lines = [ln for ln in err.splitlines() if ln.strip()]
            if watchdog.fired:
                failures.append(f"{what}: hung (status {status})")
            elif isinstance(status, str):
                failures.append(f"{what}: traceback {status}")
            elif status == 0:
                text = out.read_text()
                verdict = json.loads(text)
                if "findings" not in verdict:
                    failures.append(f"{what}: exit 0 without a verdict")
                elif name in PLANTED and not verdict["partial"] and Path(rel).name not in text:
                    failures.append(f"{what}: read, or left out without a word")
            elif status == 2:
                if len(lines) != 1 or not lines[0].startswith("doctor: "):
                    failures.append(f"{what}: exit 2 but not one line: {err[-300:]!r}")
            else:
                failures.append(f"{what}: exit {status}: {err[-300:]!r}")
            shutil.rmtree(folder / f"case{i}", ignore_errors=True)
    return failures


def test_bytes_that_are_not_utf8_in_the_argv_or_out_still_give_a_report(tmp_path: Path) -> None:
    """``doctor run --out $'runs/\\xff' python job.py $'\\xfe'``: the report is written, the
    bytes shown as U+FFFD."""
    (tmp_path / "job.py").write_text(MARKER_JOB)
    out = os.fsencode(tmp_path / "runs") + b"/\xff"
    ran = subprocess.run([os.fsencode(sys.executable), b"-m", b"doctor.cli", b"run", b"--quiet",
                          b"--window", b"off", b"--out", out, b"--", os.fsencode(sys.executable),
                          b"job.py", b"marker.txt", b"\xfe"],
                         cwd=tmp_path, capture_output=True, timeout=240)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert b"could not analyse" not in ran.stderr and b"Traceback" not in ran.stderr
    run_dir = Path(os.fsdecode(out))
    verdict = json.loads((run_dir / "verdict.json").read_text())
    assert verdict["steps"] and (run_dir / "report.html").is_file()
    assert "\ufffd" in (run_dir / "report.html").read_text()


@pytest.mark.parametrize("folder", ["rank-0", "rank-0/main", "bootstrap-errors"])
def test_a_folder_that_leads_out_of_the_run_directory_is_not_followed(
        recorded: Path, tmp_path: Path, folder: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A folder of the run replaced by a link to a copy of it outside: the copy is never read
    (the process it holds is left out, with a note)."""
    case_dir = tmp_path / "run"
    shutil.copytree(recorded, case_dir, symlinks=True, copy_function=os.link)
    [path] = case_dir.glob(f"{folder}*")
    outside = tmp_path / "outside"
    path.rename(outside)
    path.symlink_to(outside, target_is_directory=True)
    status, err = report(case_dir, tmp_path / "verdict.json", capsys)
    assert status in (0, 2), (status, err)
    if status == 2:
        assert len(err.strip().splitlines()) == 1
        return
    text = (tmp_path / "verdict.json").read_text()
    if folder == "bootstrap-errors":
        assert "4242" not in text and "no module named x" not in text
    else:
        verdict = json.loads(text)
        assert verdict["partial"] and "leads out of the run directory" in text
