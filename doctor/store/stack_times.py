"""Stack samples on a time axis: when each thread was seen in which stack.

py-spy records a process as a chrome trace (``--format chrometrace``: a begin and an end event
per frame where the sampled stack changed, in microseconds from py-spy's start); the parent
turns it into py-spy's raw format (doctor.store.stacks, read as before) and into
``stack-times.txt``: one line per run of identical samples of a thread,
``T0_US T1_US thread (TID);frame;frame;...`` (microseconds from the sampled span's start,
outermost frame first, each frame ``function (file:line)`` as in the raw format). The
in-process sampler writes the same, with no thread frame (it samples one thread). The analysis
places each run on the steps it overlaps (doctor.analyse.spike_calls).

A run lasts from its first sample to the next sample that differs, so runs tile the span and
their lengths are wall time; the raw counts made from them are each run's length at the rate
(at least one sample each).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from .layout import stack_times_names, stacks_names
from .safe_files import write_text_atomic
from .stacks import format_raw

#: (start, end) in microseconds from the span's start, and the stack (outermost first)
Run = tuple[int, int, tuple[str, ...]]


def from_chrometrace(events: Sequence[object], rate_hz: float
                     ) -> tuple[dict[tuple[str, ...], int], list[Run]]:
    """py-spy's chrome trace (its list of events) as raw counts and runs, each stack starting
    with its ``thread (TID)`` frame. Events that are not a begin or an end are left out."""
    stacks: dict[int, list[str]] = {}
    since: dict[int, int] = {}  # tid -> when its stack took its present form
    runs: list[Run] = []
    for event in events:
        if not isinstance(event, dict) or event.get("ph") not in ("B", "E"):
            continue
        tid, ts = event.get("tid"), event.get("ts")
        if not isinstance(tid, int) or not isinstance(ts, (int, float)):
            continue
        ts = int(ts)
        stack = stacks.setdefault(tid, [])
        if ts > since.get(tid, ts) and stack:  # the stack held until now
            runs.append((since[tid], ts, tuple(stack)))
        since[tid] = max(ts, since.get(tid, ts))
        if event["ph"] == "B":
            stack.append(_frame(event))
        elif stack:
            stack.pop()
    for tid, stack in stacks.items():  # a trace cut short: its last sample
        if stack:
            runs.append((since[tid], since[tid] + round(1e6 / rate_hz), tuple(stack)))
    runs.sort(key=lambda r: r[0])
    counts: Counter[tuple[str, ...]] = Counter()
    for t0, t1, seen in runs:
        counts[seen] += max(1, round((t1 - t0) * 1e-6 * rate_hz))
    return dict(counts), runs


def _frame(event: dict[str, object]) -> str:
    args = event.get("args")
    name = str(event.get("name", "?"))
    if not isinstance(args, dict) or not args.get("filename"):
        return name  # the ``thread (TID)`` frame
    return f"{name} ({args['filename']}:{args.get('line', 0)})"


def convert_chrometrace(proc_dir: Path, rate_hz: float, window: int = 1) -> bool:
    """Turn the chrome trace py-spy wrote for ``proc_dir`` into its raw samples and their
    runs, and remove it; False where there is none or it cannot be read (nothing written)."""
    from .readback import DATA_LIMIT, Unreadable, read_json

    trace = proc_dir / stack_times_names(window)[1]
    try:
        events = read_json(trace, DATA_LIMIT)  # a busy process's trace: as large as raw data
    except Unreadable:
        return False
    finally:
        try:
            os.unlink(trace)
        except OSError:
            pass
    if not isinstance(events, list):
        return False
    counts, runs = from_chrometrace(events, rate_hz)
    write_text_atomic(proc_dir / stacks_names(window)[0], format_raw(counts))
    write_stack_times(proc_dir, runs, window)
    return True


def format_times(runs: Iterable[Run]) -> str:
    return "".join(f"{t0} {t1} {';'.join(stack)}\n" for t0, t1, stack in runs)


def write_stack_times(proc_dir: Path, runs: Iterable[Run], window: int = 1) -> None:
    """The runs of samples, the file replaced whole (a reader never sees half)."""
    write_text_atomic(proc_dir / stack_times_names(window)[0], format_times(runs))


def parse_times(text: str, main_thread: int | None = None) -> list[Run]:
    """The runs of ``stack-times.txt``: those of thread ``main_thread`` (its thread frame
    dropped) where it is given and found, else every run (thread frames dropped)."""
    runs: list[Run] = []
    for line in text.splitlines():
        start, _, rest = line.partition(" ")
        end, _, frames = rest.partition(" ")
        if start.lstrip("-").isdigit() and end.lstrip("-").isdigit() and frames:
            runs.append((int(start), int(end), tuple(frames.split(";"))))
    threads = {_thread_of(stack[0]) for _, _, stack in runs}
    keep = main_thread if main_thread is not None and main_thread in threads else None
    out: list[Run] = []
    for t0, t1, stack in runs:
        tid = _thread_of(stack[0])
        if keep is not None and tid != keep:
            continue
        own = stack[1:] if tid is not None else stack
        if own:  # a thread seen with no Python frame (starting or ending) is left out
            out.append((t0, t1, own))
    return out


def _thread_of(frame: str) -> int | None:
    if not frame.startswith("thread ("):
        return None
    inner = frame[len("thread ("):].split(")", 1)[0]
    try:
        return int(inner, 16) if inner.startswith("0x") else int(inner)
    except ValueError:
        return None


def read_stack_times(proc_dir: Path, main_thread: int | None, window: int = 1,
                     problems: list[str] | None = None) -> list[Run] | None:
    """The runs a process folder holds for ``window`` (main_thread's), or None; a file that
    is there but is no regular file, or cannot be read, is said in ``problems``."""
    from .readback import Unreadable, read_text, regular_file

    path = proc_dir / stack_times_names(window)[0]
    if not os.path.lexists(path):
        return None
    said = problems if problems is not None else []
    if not regular_file(path):
        said.append(f"{path} is not a regular file: left out")
        return None
    try:
        return parse_times(read_text(path), main_thread)
    except (Unreadable, ValueError) as err:
        said.append(f"{path}: its stack times cannot be read ({type(err).__name__}): left out")
        return None


__all__ = ["Run", "convert_chrometrace", "format_times", "from_chrometrace", "parse_times",
           "read_stack_times", "write_stack_times"]
