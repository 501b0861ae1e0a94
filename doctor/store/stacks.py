"""Stack samples on disk: ``stacks.txt`` in py-spy's raw format, and ``stacks.json`` beside it.

``stacks.txt`` holds one line per distinct stack, ``frame;frame;... N``, outermost frame first,
each frame ``function (file:line)``; with py-spy's ``--threads`` each stack starts with a
``thread (TID): NAME`` frame: the main thread's samples are kept, and those of the threads that
put into a queue (a loader thread the job made itself), less their waits in ``put``: the
``producers``. ``stacks.json`` says how they were taken: the recorder, its rate,
the sampled span on the shared monotonic clock, and the number of samples taken. Both recorders
(py-spy from the parent, the in-process sampler) write through here. The stacks sampled beside a
later window (the N-th, opened where the run slowed down) are ``stacks-N.txt``/``.json``; each
function takes the window's number (1: the first). The same samples on the time axis, for the
steps they fell in, are doctor.store.stack_times' ``stack-times.txt``.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .layout import pid_of, stacks_names
from .safe_files import write_text_atomic

DEFAULT_RATE_HZ = 50.0
MAIN_THREAD, PRODUCER_THREAD = "main", "producer"  # the stacks frame's ``thread``


@dataclass(frozen=True)
class StackSamples:
    """Samples of one process's main thread, running or not: stack (outermost first) -> count."""

    stacks: dict[tuple[str, ...], int]
    recorder: str
    rate_hz: float
    span_ns: tuple[int, int]
    taken: int  # samples the recorder reports (all threads, for py-spy)
    #: the samples of threads that put into a queue (a loader thread), less their ``put`` waits
    producers: dict[tuple[str, ...], int] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return sum(self.stacks.values())


def stacks_output(proc_dir: Path, window: int = 1) -> Path:
    """Where a recorder writes the raw samples of the process in ``proc_dir``."""
    return proc_dir / stacks_names(window)[0]


def read_stacks(proc_dir: Path, meta: dict[str, Any] | None = None, window: int = 1
                ) -> StackSamples | None:
    """The samples a process folder holds (``meta``: its stacks.json, when already read), or
    None."""
    from .readback import Unreadable, as_float, as_int, read_text

    txt = proc_dir / stacks_names(window)[0]
    meta = read_stacks_meta(proc_dir, window) if meta is None else meta
    if meta is None or not os.path.lexists(txt):
        return None
    try:
        text = read_text(txt)
        threads = split_threads(text)  # read once for both
        stacks = parse_raw(text, main_thread=pid_of(proc_dir), threads=threads)
        producers = parse_producers(text, main_thread=pid_of(proc_dir), threads=threads)
    except (Unreadable, ValueError):
        return None
    rate = as_float(meta.get("rate_hz"))
    return StackSamples(stacks, str(meta.get("recorder", "?")),
                        rate if rate and rate > 0 else DEFAULT_RATE_HZ,
                        (as_int(meta.get("start_ns")) or 0, as_int(meta.get("end_ns")) or 0),
                        as_int(meta.get("taken")) or 0, producers)


_THREAD = re.compile(r"^thread \((?:0x)?(?P<tid>[0-9A-Fa-f]+)\)(: .*)?$")


def split_threads(text: str) -> tuple[Counter[tuple[str, ...]],
                                      dict[int, Counter[tuple[str, ...]]]]:
    """py-spy's raw format, read once: (the stacks with no thread frame, each thread's stacks
    without its ``thread (TID): NAME`` frame). A thread sample with no Python frame (the
    interpreter is shutting down) is left out."""
    out: Counter[tuple[str, ...]] = Counter()
    by_thread: dict[int, Counter[tuple[str, ...]]] = {}
    for line in text.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = tuple(stack.split(";"))
        m = _THREAD.match(frames[0])
        if m is None:
            out[frames] += int(count)
            continue
        tid = int(m["tid"], 16) if frames[0].startswith("thread (0x") else int(m["tid"])
        counts = by_thread.setdefault(tid, Counter())
        if len(frames) > 1:
            counts[frames[1:]] += int(count)
    return out, by_thread


def parse_raw(text: str, main_thread: int | None = None,
              threads: tuple[Counter[tuple[str, ...]], dict[int, Counter[tuple[str, ...]]]]
              | None = None) -> dict[tuple[str, ...], int]:
    """py-spy's raw format. With ``--threads`` each stack starts with ``thread (TID): NAME``:
    that frame is dropped, and only thread ``main_thread`` is kept when it is given and found.
    ``threads``: the text already split (split_threads)."""
    out, by_thread = threads if threads is not None else split_threads(text)
    if not by_thread:
        return dict(out)
    if main_thread is not None and main_thread in by_thread:
        return dict(by_thread[main_thread])
    merged = Counter(out)
    for counts in by_thread.values():
        merged.update(counts)
    return dict(merged)


#: A frame of a queue's ``put``: the standard library's, multiprocessing's, or a class's own
PUT = re.compile(r"^(\w+\.)?put(_nowait)? \((.*/)?(queue|multiprocessing/queues)\.py:\d+\)$")


def parse_producers(text: str, main_thread: int | None,
                    threads: tuple[Counter[tuple[str, ...]], dict[int, Counter[tuple[str, ...]]]]
                    | None = None) -> dict[tuple[str, ...], int]:
    """With ``--threads``: the samples of the threads other than ``main_thread`` that were seen
    in a queue's ``put`` (threads that feed the training loop), less those inside ``put`` (a
    full queue: the loop is not waiting for them). Empty without thread frames. ``threads``:
    the text already split (split_threads)."""
    _, by_thread = threads if threads is not None else split_threads(text)
    out: Counter[tuple[str, ...]] = Counter()
    for tid, counts in by_thread.items():
        if tid != main_thread and any(PUT.match(f) for stack in counts for f in stack):
            out.update({s: n for s, n in counts.items() if not any(PUT.match(f) for f in s)})
    return dict(out)


def format_raw(stacks: Mapping[tuple[str, ...], int]) -> str:
    return "".join(f"{';'.join(s)} {n}\n" for s, n in stacks.items())


def read_stacks_meta(proc_dir: Path, window: int = 1) -> dict[str, Any] | None:
    """A process folder's stacks.json (recorder, rate, span, samples taken), or None."""
    from .readback import Unreadable, read_json

    try:
        meta = read_json(proc_dir / stacks_names(window)[1])
    except Unreadable:
        return None
    return meta if isinstance(meta, dict) else None


def write_stacks_meta(proc_dir: Path, *, recorder: str, rate_hz: float, start_ns: int,
                      end_ns: int, taken: int, busy_threads: int | None = None,
                      threads: int | None = None, window: int = 1) -> None:
    _write_atomic(proc_dir / stacks_names(window)[1], json.dumps(
        {"recorder": recorder, "rate_hz": rate_hz, "start_ns": start_ns, "end_ns": end_ns,
         "taken": taken, "busy_threads": busy_threads, "threads": threads}))


def write_stacks(proc_dir: Path, stacks: Mapping[tuple[str, ...], int], *, recorder: str,
                 rate_hz: float, start_ns: int, end_ns: int, taken: int) -> None:
    """Samples and their description, each file replaced whole (a reader never sees half)."""
    _write_atomic(proc_dir / stacks_names(1)[0], format_raw(stacks))
    write_stacks_meta(proc_dir, recorder=recorder, rate_hz=rate_hz, start_ns=start_ns,
                      end_ns=end_ns, taken=taken)


def _write_atomic(path: Path, text: str) -> None:
    write_text_atomic(path, text)  # a fresh temporary renamed into place, never through a link
