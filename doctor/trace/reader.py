"""Stream the events of a Chrome-trace (torch.profiler / Kineto) JSON file, plain or gzipped.

Real GPU traces reach gigabytes; ``json.load`` on them needs many times their size in memory. This
reader decodes one event at a time with :meth:`json.JSONDecoder.raw_decode` over a bounded buffer
of text read in chunks, so memory stays near one chunk plus whatever the caller keeps.

Both layouts written since 2020 are accepted: an object with ``"traceEvents"`` and other top-level
keys (``distributedInfo``, ``deviceProperties``, ``baseTimeNanoseconds``, ...), in any order, and a
bare list of events (torch 1.7/1.8 era traces). Numbers of any size decode (Python ints are
unbounded); a file that ends early or is not JSON raises :class:`TraceError` with one line.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

try:  # Intel's ISA-L: gunzip at three to four times zlib's speed
    from isal import igzip, isal_zlib
except ImportError:  # pragma: no cover - a dependency; a missing wheel falls back to zlib
    igzip = isal_zlib = None  # type: ignore[assignment]

from doctor.errors import TraceError
from doctor.trace.typed_events import Event, decode_block, from_dicts

__all__ = ["GUNZIP", "TraceError", "TraceMeta", "TraceStream", "iter_events"]

#: Which gunzip reads gzipped traces: "isal" (ISA-L) or "zlib" (the standard library's).
GUNZIP = "isal" if igzip is not None else "zlib"
_GUNZIP_ERRORS: tuple[type[Exception], ...] = (EOFError, OSError, zlib.error, *(
    (cast(type[Exception], isal_zlib.error),) if isal_zlib is not None else ()))

CHUNK_CHARS = 1 << 20
#: Text decoded as one block of typed events (doctor.trace.typed_events): about 5,000 events,
#: small enough that their records are still in the CPU's cache when doctor.trace.collect reads
#: them (8 MB blocks took a third longer).
BLOCK_CHARS = 1 << 20
#: A single event or metadata value larger than this is taken for invalid JSON, not read on.
MAX_VALUE_CHARS = 256 << 20
_SKIP = re.compile(r"[\s,]*")  # whitespace and separators between array elements
_WS = re.compile(r"\s*")


@dataclass(frozen=True)
class TraceMeta:
    """Top-level facts of one trace. Absent facts are None (or empty)."""

    path: str
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    device_properties: tuple[dict[str, Any], ...] = ()
    base_time_ns: int | None = None
    schema_version: int | None = None
    raw: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_top_level(cls, path: str, top: dict[str, Any]) -> TraceMeta:
        dist = top.get("distributedInfo")
        dist = dist if isinstance(dist, dict) else {}
        props = top.get("deviceProperties")
        props_t = tuple(p for p in props if isinstance(p, dict)) if isinstance(props, list) else ()
        return cls(
            path=path,
            rank=_as_int(dist.get("rank")),
            world_size=_as_int(dist.get("world_size")),
            backend=dist.get("backend") if isinstance(dist.get("backend"), str) else None,
            device_properties=props_t,
            base_time_ns=_as_int(top.get("baseTimeNanoseconds")),
            schema_version=_as_int(top.get("schemaVersion")),
            raw=dict(top),
        )


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _open_text(path: Path) -> IO[str]:
    with path.open("rb") as probe:
        magic = probe.read(2)
    if magic == b"\x1f\x8b":
        return io.TextIOWrapper(_gunzip(path), encoding="utf-8", errors="replace")
    return path.open("r", encoding="utf-8", errors="replace")


def _gunzip(path: Path) -> IO[bytes]:
    if igzip is not None:
        return igzip.open(path, "rb")
    return gzip.open(path, "rb")  # pragma: no cover - isal is a dependency


class TraceStream:
    """One pass over a trace file: iterate for the events; ``meta`` is complete once exhausted.

    Top-level keys other than ``traceEvents`` are collected into :attr:`top_level` as they pass,
    so metadata written before the events is available at the first event, and metadata written
    after them (``baseTimeNanoseconds``, ``traceName`` in recent Kineto) once iteration ends.
    """

    def __init__(self, path: str | Path, chunk_chars: int | None = None) -> None:
        self.path = Path(path)
        # text is read a chunk at a time, and no more than a block at once
        self.chunk_chars = chunk_chars or min(CHUNK_CHARS, BLOCK_CHARS)
        self.top_level: dict[str, Any] = {}
        self.event_count = 0
        self._decoder = json.JSONDecoder()
        self._buf = ""
        self._pos = 0
        self._eof = False
        self._fh: IO[str] | None = None

    @property
    def meta(self) -> TraceMeta:
        return TraceMeta.from_top_level(str(self.path), self.top_level)

    # -- buffer management -------------------------------------------------------------------

    def _fill(self, want: int | None = None) -> bool:
        """Read one more chunk (or ``want`` chars) into the buffer; False at end of file."""
        if self._eof or self._fh is None:
            return False
        try:
            data = self._fh.read(max(want or 0, self.chunk_chars))
        except _GUNZIP_ERRORS as err:
            raise TraceError(f"{self.path.name}: cannot decompress: {err}") from err
        if not data:
            self._eof = True
            return False
        self._buf = self._buf[self._pos:] + data
        self._pos = 0
        return True

    def _skip(self, pattern: re.Pattern[str]) -> str:
        """Skip ``pattern`` from the cursor and return the next character ('' at end of file)."""
        while True:
            m = pattern.match(self._buf, self._pos)
            self._pos = m.end() if m else self._pos
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if not self._fill():
                return ""

    def _value(self, where: str) -> Any:
        """Decode one JSON value at the cursor, reading more text until it is complete."""
        want = self.chunk_chars
        self._skip(_WS)
        while True:
            try:
                value, end = self._decoder.raw_decode(self._buf, self._pos)
            except json.JSONDecodeError as err:
                # Incomplete at the end of the buffer (or invalid): read more and retry.
                if len(self._buf) - self._pos < MAX_VALUE_CHARS and self._fill(want):
                    want *= 2  # a value larger than a chunk: grow geometrically, not quadratically
                    continue
                raise TraceError(f"{self.path.name}: {self._describe(where, err)}") from None
            if end >= len(self._buf) and self._fill(want):
                continue  # a number may continue past the buffer: decode again with more text
            self._pos = end
            return value

    def _describe(self, where: str, err: json.JSONDecodeError) -> str:
        """What is wrong where decoding failed: the file ends there (cut short), or the text
        is not JSON (then where in the value it is not)."""
        cut = self._eof and (err.pos >= len(self._buf.rstrip())
                             or err.msg.startswith("Unterminated string"))
        if cut:
            return (f"file ends inside {where} after {self.event_count} events (truncated?) "
                    f"({err.msg})")
        return (f"invalid JSON in {where} after {self.event_count} events ({err.msg}, "
                f"{err.pos - self._pos} characters into the value)")

    def _expect(self, char: str, where: str) -> None:
        got = self._skip(_WS)
        if got != char:
            found = repr(got) if got else "end of file"
            raise TraceError(f"{self.path.name}: expected {char!r} in {where}, found {found}")
        self._pos += 1

    # -- structure ---------------------------------------------------------------------------

    def _events(self, where: str) -> Iterator[dict[str, Any]]:
        self._expect("[", where)
        decode = self._decoder.raw_decode
        skip = _SKIP.match
        while True:
            # Fast path: the next event lies whole inside the buffer (all but one per chunk).
            buf = self._buf
            m = skip(buf, self._pos)
            pos = m.end() if m else self._pos
            if pos < len(buf) and buf[pos] == "{":
                try:
                    value, end = decode(buf, pos)
                except json.JSONDecodeError:
                    end = -1
                if 0 < end < len(buf):
                    self._pos = end
                    self.event_count += 1
                    yield value
                    if end > self.chunk_chars:
                        self._buf = self._buf[end:]
                        self._pos = 0
                    continue
            self._pos = pos
            if self._array_ends(where):
                return
            value = self._value(where)
            if isinstance(value, dict):
                self.event_count += 1
                yield value
            if self._pos > self.chunk_chars:
                self._buf = self._buf[self._pos:]
                self._pos = 0

    def _array_ends(self, where: str) -> bool:
        """Skip to the next element of the event array: True at its closing bracket (then
        passed); TraceError when the file ends first."""
        nxt = self._skip(_SKIP)
        if nxt == "]":
            self._pos += 1
            return True
        if not nxt:
            raise TraceError(
                f"{self.path.name}: file ends inside {where} after {self.event_count} events "
                "(truncated?)"
            )
        return False

    def _event_blocks(self, where: str) -> Iterator[list[Event]]:
        """The event array in blocks of about BLOCK_CHARS: each ends at the last event of the
        buffer whose text decodes (a split inside a value does not); an event that no block
        holds (larger than a block, or a file that ends early) is read the slow way, which says
        what is wrong with it."""
        self._expect("[", where)
        while not self._array_ends(where):
            self._fill_block()
            block = self._block()
            yield block if block is not None else self._one_event(where)

    def _event_texts(self, where: str) -> Iterator[str | list[Event]]:
        """The event array as the text of blocks of about BLOCK_CHARS (comma-separated events,
        for another process to decode), each cut at the last ``}`` of the buffer that a next
        event or the array's end follows; an event that no block holds comes decoded, as in
        :meth:`_event_blocks`. A cut can fall inside a value (a string holding ``}, {``): the
        text then does not decode, and the reader must say so (doctor.trace.parallel reads the
        trace again, one block after the other)."""
        self._expect("[", where)
        while not self._array_ends(where):
            self._fill_block()
            close = next(self._cuts(), None)
            if close is None:
                yield self._one_event(where)
                continue
            text = self._buf[self._pos:close + 1]
            self._pos = close + 1
            yield text

    def _fill_block(self) -> None:
        while len(self._buf) - self._pos < BLOCK_CHARS and self._fill(BLOCK_CHARS):
            pass

    def _one_event(self, where: str) -> list[Event]:
        """The next event, read the slow way (which says what is wrong with it)."""
        value = self._value(where)
        if not isinstance(value, dict):
            return []
        self.event_count += 1
        return from_dicts([value])

    def _cuts(self, tries: int = 8) -> Iterator[int]:
        """Where the block from the cursor may end: the last ``}`` of the buffer (of the last
        ``tries``) that a next event (``,{``) or the array's end follows."""
        buf, start = self._buf, self._pos
        end = len(buf)
        for _ in range(tries):
            close = buf.rfind("}", start, end)
            if close < 0:
                return
            end = close
            after = _WS.match(buf, close + 1).end()  # type: ignore[union-attr]
            if after >= len(buf):
                continue  # what follows is not read yet
            if buf[after] == ",":
                nxt = _WS.match(buf, after + 1).end()  # type: ignore[union-attr]
                if nxt >= len(buf) or buf[nxt] != "{":
                    continue  # inside an event ("args": {...}, "ts": ...)
            elif buf[after] != "]":
                continue
            yield close

    def _block(self) -> list[Event] | None:
        """The events from the cursor to the last whole event of the buffer, decoded; None when
        no cut decodes."""
        for close in self._cuts():
            events = decode_block(self._buf[self._pos:close + 1])
            if events is not None:
                self._pos = close + 1
                self.event_count += len(events)
                return events
        return None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        yield from self._walk(self._events)

    def blocks(self) -> Iterator[list[Event]]:
        """The events as typed records (doctor.trace.typed_events), a block at a time: the text
        of many events is decoded at once, at C speed, never a dict per event."""
        yield from self._walk(self._event_blocks)

    def texts(self) -> Iterator[str | list[Event]]:
        """The events as the text of blocks, for other processes to decode
        (:meth:`_event_texts`); an event too large for a block comes decoded."""
        yield from self._walk(self._event_texts)

    def _walk(self, events: Any) -> Iterator[Any]:
        if not self.path.exists():
            raise TraceError(f"{self.path}: no such trace file")
        self._fh = _open_text(self.path)
        try:
            first = self._skip(_WS)
            if first == "[":
                yield from events("the event list")
            elif first == "{":
                yield from self._object(events)
            elif not first:
                raise TraceError(f"{self.path.name}: empty file, not a trace")
            else:
                raise TraceError(f"{self.path.name}: not a Chrome trace (starts with {first!r})")
        finally:
            self._fh.close()
            self._fh = None
            self._buf = ""
            self._pos = 0

    def _object(self, events: Any) -> Iterator[Any]:
        self._pos += 1  # the opening brace
        while True:
            nxt = self._skip(_SKIP)
            if nxt == "}":
                return
            if not nxt:
                raise TraceError(
                    f"{self.path.name}: file ends inside the top-level object after "
                    f"{self.event_count} events (truncated?)"
                )
            key = self._value("a top-level key")
            if not isinstance(key, str):
                raise TraceError(f"{self.path.name}: top-level key {key!r} is not a string")
            self._expect(":", f"top-level key {key!r}")
            if key == "traceEvents":
                self._skip(_WS)
                yield from events('"traceEvents"')
            else:
                self.top_level[key] = self._value(f"top-level key {key!r}")


def iter_events(path: str | Path, chunk_chars: int = CHUNK_CHARS) -> Iterator[dict[str, Any]]:
    """Yield every event (a dict) of the trace at ``path``, streaming; TraceError if broken."""
    yield from TraceStream(path, chunk_chars)
