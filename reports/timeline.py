"""The run's timeline as a Chrome-trace / Perfetto JSON file (``timeline.json.gz``).

The JSON object format of the Trace Event Format: ``traceEvents`` (metadata events naming each
process and thread, complete events ``ph: X`` for slices, counter events ``ph: C``),
``displayTimeUnit``, and ``otherData`` with what doctor says about the file (what it holds, what
was capped). ui.perfetto.dev and chrome://tracing open it, gzipped or not. Formats only: what
goes in is doctor.analyse.timeline's.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from doctor.analyse.timeline import COUNTER_CAP, INTERVAL_CAP, ProcessTrack, RunTimeline
from doctor.store.safe_files import open_new, write_atomic
from doctor.trace.window_events import EVENT_CAP
from doctor.version import __version__

FORMAT = "doctor.timeline/1"
#: chrome://tracing's reserved colour names by slice name prefix (ui.perfetto.dev colours by
#: name, so the stage in a fetch's name colours it there).
_COLORS = {"fetch: io": "thread_state_iowait", "fetch: decode": "rail_load",
           "fetch: preprocess": "rail_animation", "fetch": "rail_idle",
           "collate": "rail_response", "DataLoader wait": "bad", "backward": "thread_state_running",
           "optimizer step": "good", "deep window": "grey", "stack sampling": "olive",
           "closing": "terrible"}
HOW_TO_OPEN = ("Open it at https://ui.perfetto.dev (Open trace file; it stays on your machine) "
               "or in chrome://tracing (Load); either reads the .gz as it is.")


def timeline_events(timeline: RunTimeline) -> Iterator[dict[str, Any]]:
    for proc in timeline.processes:
        yield from _process_events(proc)


def _process_events(proc: ProcessTrack) -> Iterator[dict[str, Any]]:
    pid = proc.pid
    yield {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": proc.name}}
    yield {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
           "args": {"sort_index": proc.sort}}
    for order, thread in enumerate(proc.threads):
        yield {"ph": "M", "name": "thread_name", "pid": pid, "tid": thread.tid,
               "args": {"name": thread.name}}
        yield {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": thread.tid,
               "args": {"sort_index": order}}
        for part in thread.slices:
            coloured = part.category != "step"  # "step N": no colour's name (a million of them)
            for i, (name, ts, dur) in enumerate(zip(part.names, part.start_us.tolist(),
                                                    part.dur_us.tolist(), strict=True)):
                event: dict[str, Any] = {"ph": "X", "cat": part.category, "name": name,
                                         "pid": pid, "tid": thread.tid, "ts": round(ts, 3),
                                         "dur": round(max(dur, 0.0), 3)}
                color = _color(name) if coloured else None
                if color:
                    event["cname"] = color
                if part.args is not None:
                    event["args"] = part.args[i]
                yield event
    for counter in proc.counters:
        names = list(counter.series)
        columns = [counter.series[n].tolist() for n in names]
        for i, ts in enumerate(counter.t_us.tolist()):
            values = {n: round(col[i], 3) for n, col in zip(names, columns, strict=True)
                      if math.isfinite(col[i])}
            if values:
                yield {"ph": "C", "name": counter.name, "pid": pid, "tid": 0,
                       "ts": round(ts, 3), "args": values}


def _color(name: str) -> str | None:
    for prefix, color in _COLORS.items():
        if name.startswith(prefix):
            return color
    return None


def render_timeline(timeline: RunTimeline, source: str, events: bool = True) -> dict[str, Any]:
    """The whole file as one JSON object (without its events: ``events=False``)."""
    rest = {
        "displayTimeUnit": "ms",
        "otherData": {
            "format": FORMAT, "doctor_version": __version__, "source": source,
            "clock": "microseconds from the run's start (each node's monotonic clock); the "
                     "torch.profiler window's events are put on it by the clock pair the window "
                     "recorded as it opened (a run recorded without one: its first event at the "
                     "window's start)",
            "bounded": f"every step is kept; each process keeps its newest {INTERVAL_CAP:,} "
                       f"DataLoader and step-hook intervals and its profiler window its newest "
                       f"{EVENT_CAP:,} events (fewer in a run of many processes); counters at "
                       f"most {COUNTER_CAP:,} samples each; `capped` says what was left out",
            "capped": timeline.notes,
            "how_to_open": HOW_TO_OPEN,
        },
    }
    return {"traceEvents": list(timeline_events(timeline)), **rest} if events else rest


def _json_parts(timeline: RunTimeline, source: str, batch: int = 20_000) -> Iterator[bytes]:
    """The file's JSON (render_timeline's object) in parts: the events a batch at a time, each
    through json's C encoder."""
    whole = render_timeline(timeline, source, events=False)
    head = _dumps(whole)
    yield b'{"traceEvents":['
    pending: list[dict[str, Any]] = []
    first = True
    for event in timeline_events(timeline):
        pending.append(event)
        if len(pending) >= batch:
            yield (b"" if first else b",") + _dumps(pending)[1:-1]
            pending, first = [], False
    if pending:
        yield (b"" if first else b",") + _dumps(pending)[1:-1]
    yield b"]," + head[1:]  # the rest of the object, after its emptied traceEvents


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


def write_timeline(timeline: RunTimeline, source: str, path: Path) -> Path:
    """Write the gzipped file (plain JSON when ``path`` does not end in .gz) through a new file
    renamed over ``path``: a link there is replaced, never written through."""
    if path.name.endswith(".gz"):  # streamed: a timeline of a million steps is never whole text
        with open_new(path) as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6,
                                                  filename="") as out:
            for part in _json_parts(timeline, source):
                out.write(part)
    else:
        write_atomic(path, b"".join(_json_parts(timeline, source)))
    return path
