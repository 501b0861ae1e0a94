"""A large synthetic Kineto trace made of K time-shifted copies of a real one.

    python bench/synth_trace.py --copies 10 -o /tmp/doctor-bench/ddp_x10.json.gz
    python bench/synth_trace.py --events 2000000 -o big.json
    python bench/synth_trace.py --bytes 4G -o /tmp/doctor-bench/ddp_4g.json.gz   # 4 GB of JSON

Copy k of every event is shifted by k times the source's span (first timestamp to last end), so
the copies follow one another and their steps never overlap; ``ProfilerStep#N`` becomes
``ProfilerStep#(N + k * steps)``; flow ids, correlation ids, External ids and the other ids that
link events (``Ev Idx``, ``Sequence number``, the Python tracer's ids) are offset by k times their
range, so they stay unique and each copy's links point inside that copy. What a trace holds once
(metadata ``M`` events, the profiler's own span, its global instants) is written once, the span
stretched over every copy and ``Record Window End`` moved to the end of the last one. The top-level
keys (``distributedInfo``, ``deviceProperties``, ...) are copied as they are, in their order.

The source is read whole (a real trace of a few tens of MB); the output is written as it is made,
a few thousand events at a time, so a 4 GB trace takes the memory of the source, not of the output.
Each event becomes one line of JSON (``json.dumps``' separators); ``.gz`` outputs are gzipped
(``--level``). The file appears under its name only once complete (written to NAME.part first).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_SOURCE = Path(__file__).resolve().parents[2] / "shared" / "traces" / \
    "ddp_v100_rank1_of_2.json.gz"
if not DEFAULT_SOURCE.exists():
    DEFAULT_SOURCE = Path("/work/shared/traces/ddp_v100_rank1_of_2.json.gz")

#: Keys whose integer values link events to one another: offset by a shared range per copy
#: (the flow ``id`` of an ac2g arrow equals the ``correlation`` of its launch and kernel).
TOP_IDS = frozenset({"id", "bind_id"})
ARG_IDS = frozenset({"correlation", "External id", "Ev Idx", "Sequence number",
                     "Record function id", "Python id", "Python parent id"})
STEP_RE = re.compile(r"ProfilerStep#(\d+)")
CHUNK_EVENTS = 4096
MARK = "\x01"  # a placeholder string value; json.dumps writes it as "\u0001"
MARK_JSON = json.dumps(MARK)


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*([\d.]+)\s*([kKmMgGtT]?)[iI]?[bB]?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4G, 500M, 123456)")
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2).lower()]
    return int(float(m.group(1)) * scale)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _once(ev: dict[str, Any]) -> bool:
    """Written once, not per copy: metadata, the profiler's own span, its global instants."""
    return ev.get("ph") == "M" or ev.get("cat") == "Trace" or \
        (ev.get("ph") == "i" and ev.get("s") == "g")


class Source:
    """The source trace, read whole, and the ranges the copies are shifted by."""

    def __init__(self, path: Path) -> None:
        opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
        with opener(path, "rt", encoding="utf-8") as fh:  # type: ignore[operator]
            data = json.load(fh)
        if isinstance(data, list):
            data = {"traceEvents": data}
        self.path = path
        self.top = data
        events = [e for e in data.get("traceEvents", []) if isinstance(e, dict)]
        self.once = [e for e in events if _once(e)]
        self.repeated = [e for e in events if not _once(e)]
        starts = [e["ts"] for e in events if e.get("ph") != "M" and _is_num(e.get("ts"))]
        ends = [e["ts"] + (e["dur"] if _is_num(e.get("dur")) else 0)
                for e in events if e.get("ph") != "M" and _is_num(e.get("ts"))]
        if not starts:
            sys.exit(f"{path}: no timed events to copy")
        self.t0, self.t1 = min(starts), max(ends)
        self.period = max(1, math.ceil(self.t1 - self.t0))  # integer: int timestamps stay ints
        ids = [v for e in events for v in _id_values(e)]
        self.id_period = max(ids) + 1 if ids else 1
        steps = [int(m.group(1)) for e in events
                 if isinstance(e.get("name"), str) and (m := STEP_RE.fullmatch(e["name"]))]
        self.step_period = max(steps) - min(steps) + 1 if steps else 0
        self.steps = len({s for s in steps})


def _id_values(ev: dict[str, Any]) -> list[int]:
    out = [ev[k] for k in TOP_IDS if _is_int(ev.get(k)) and ev[k] >= 0]
    args = ev.get("args")
    if isinstance(args, dict):
        out += [args[k] for k in ARG_IDS if _is_int(args.get(k)) and args[k] >= 0]
    return out


class Template:
    """Many events as one %-format string and, per placeholder, its value in copy 0 and the
    amount it grows by per copy: copy k is ``text % tuple(b + k * d for b, d in ...)``."""

    def __init__(self, events: list[dict[str, Any]], src: Source) -> None:
        self.bases: list[int | float] = []
        self.deltas: list[int | float] = []
        self.formats: list[str] = []
        texts = []
        for ev in events:
            marked = self._mark(ev, src)
            texts.append(json.dumps(marked).replace("%", "%%"))
        text = ",\n".join(texts)
        pieces = text.split(MARK_JSON)
        if len(pieces) - 1 != len(self.bases):  # a source string equal to the mark: unlikely
            raise SystemExit(f"{src.path}: placeholder mismatch; cannot template this trace")
        formats = [*self.formats, ""]
        self.text = "".join(p + f for p, f in zip(pieces, formats, strict=True))

    def _mark(self, ev: dict[str, Any], src: Source) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in ev.items():
            if key == "ts" and _is_num(value):
                self._add(value, src.period, value)
                out[key] = MARK
            elif key in TOP_IDS and _is_int(value) and value >= 0:
                self._add(value, src.id_period, value)
                out[key] = MARK
            elif key == "name" and isinstance(value, str) and src.step_period and \
                    (m := STEP_RE.fullmatch(value)):
                self._add(int(m.group(1)), src.step_period, 0, fmt='"ProfilerStep#%d"')
                out[key] = MARK
            elif key == "args" and isinstance(value, dict):
                args: dict[str, Any] = {}
                for k, v in value.items():
                    if k in ARG_IDS and _is_int(v) and v >= 0:
                        self._add(v, src.id_period, v)
                        args[k] = MARK
                    else:
                        args[k] = v
                out[key] = args
            else:
                out[key] = value
        return out

    def _add(self, base: int | float, delta: int | float, like: int | float,
             fmt: str | None = None) -> None:
        self.bases.append(base)
        self.deltas.append(delta)
        self.formats.append(fmt or ("%d" if isinstance(like, int) else "%.3f"))

    def render(self, k: int) -> str:
        if k == 0:
            return self.text % tuple(self.bases)
        return self.text % tuple([b + k * d for b, d in zip(self.bases, self.deltas, strict=True)])


def _open_out(path: Path, gz: bool, level: int) -> Any:
    if gz:
        return gzip.open(path, "wb", compresslevel=level)
    return path.open("wb", buffering=1 << 20)


def write_trace(src: Source, out: Path, copies: int, level: int = 6,
                progress: bool = False) -> dict[str, Any]:
    """Write ``copies`` shifted copies of ``src`` to ``out``; returns what was written."""
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(out.name + ".part")
    shift_all = (copies - 1) * src.period
    once = []
    for ev in src.once:
        ev = dict(ev)
        if ev.get("cat") == "Trace" and _is_num(ev.get("dur")):
            ev["dur"] = ev["dur"] + shift_all
        elif ev.get("ph") == "i" and ev.get("name") == "Record Window End" and \
                _is_num(ev.get("ts")):
            ev["ts"] = ev["ts"] + shift_all
        once.append(json.dumps(ev))
    chunks = [Template(src.repeated[i:i + CHUNK_EVENTS], src)
              for i in range(0, len(src.repeated), CHUNK_EVENTS)]
    keys = list(src.top)
    if "traceEvents" not in keys:
        keys.append("traceEvents")
    n_bytes = 0
    t_start = time.monotonic()
    with _open_out(part, out.name.endswith(".gz"), level) as fh:
        def write(text: str) -> None:
            nonlocal n_bytes
            data = text.encode("utf-8")
            n_bytes += len(data)
            fh.write(data)

        write("{\n")
        for i, key in enumerate(keys):
            write(f"  {json.dumps(key)}: ")
            if key != "traceEvents":
                write(json.dumps(src.top[key]))
            else:
                write("[\n")
                first = True
                for k in range(copies):
                    for chunk in chunks:
                        write(chunk.render(k) if first else ",\n" + chunk.render(k))
                        first = False
                    if progress and (k + 1) % max(1, copies // 20) == 0:
                        print(f"  copy {k + 1}/{copies}: {n_bytes / 1e9:.2f} GB, "
                              f"{time.monotonic() - t_start:.0f} s", file=sys.stderr)
                if once:
                    write(("" if first else ",\n") + ",\n".join(once))
                write("\n  ]")
            write(",\n" if i < len(keys) - 1 else "\n")
        write("}\n")
    os.replace(part, out)
    return {"path": str(out), "copies": copies, "events": copies * len(src.repeated) + len(once),
            "steps": copies * src.steps, "json_bytes": n_bytes,
            "file_bytes": out.stat().st_size, "seconds": time.monotonic() - t_start}


def copies_for(src: Source, copies: int | None, events: int | None, size: int | None) -> int:
    if copies is not None:
        return max(1, copies)
    if events is not None:
        return max(1, math.ceil((events - len(src.once)) / max(1, len(src.repeated))))
    if size is not None:
        # one copy's JSON, as copy 1 renders it (later copies' numbers have as many digits)
        chunks = [Template(src.repeated[i:i + CHUNK_EVENTS], src)
                  for i in range(0, len(src.repeated), CHUNK_EVENTS)]
        per_copy = sum(len(c.render(1).encode("utf-8")) + 2 for c in chunks)
        return max(1, math.ceil(size / per_copy))
    return 10


def build(source: Path, out: Path, copies: int | None = None, events: int | None = None,
          size: int | None = None, level: int = 6, progress: bool = False) -> dict[str, Any]:
    src = Source(source)
    return write_trace(src, out, copies_for(src, copies, events, size), level, progress)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", nargs="?", type=Path, default=DEFAULT_SOURCE,
                    help=f"the trace to copy (default {DEFAULT_SOURCE})")
    how = ap.add_mutually_exclusive_group()
    how.add_argument("--copies", type=int, help="K copies (default 10)")
    how.add_argument("--events", type=int, help="at least N events (whole copies)")
    how.add_argument("--bytes", type=parse_size, dest="size",
                     help="at least SIZE of JSON, uncompressed (4G, 500M)")
    ap.add_argument("-o", "--output", type=Path, required=True,
                    help="the trace to write (.gz: gzipped)")
    ap.add_argument("--level", type=int, default=6, help="gzip level (default 6)")
    ap.add_argument("--info", type=Path, help="also write what was written, as JSON, here")
    args = ap.parse_args()
    info = build(args.source, args.output, args.copies, args.events, args.size, args.level,
                 progress=True)
    if args.info:
        args.info.write_text(json.dumps({**info, "source": str(args.source)}, indent=1))
    print(f"{info['path']}: {info['copies']} copies, {info['events']} events, "
          f"{info['steps']} steps, {info['json_bytes'] / 1e6:.1f} MB JSON, "
          f"{info['file_bytes'] / 1e6:.1f} MB on disk, {info['seconds']:.1f} s")


if __name__ == "__main__":
    main()
