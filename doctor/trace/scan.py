"""Read a trace at the speed of the disk: its event array scanned in C straight into columns.

The C scanner (doctor/trace/_scan.c, built with the package where a compiler is) reads the
gunzipped bytes of the event array and writes, for a block of events at a time, the fields the
analysis reads into numpy columns: whether the event is complete (``ph`` "X"), the ids of its
name, category and thread in tables of the distinct strings, its start and duration, the
correlation of its launch, and where its ``args`` lie in the bytes. No Python object is made per
event; each distinct string is decoded once, here. The few args the analysis reads beyond the
correlation are read from their bytes for a block at once (doctor.trace.block_args): the memory
instants' totals as numbers in C, and for copies, collectives and host ops with a cost formula
the id of the text of the args they are computed from, so that each distinct op is decoded
(msgspec) and computed once. The columns go to the same collector as the typed events do
(doctor.trace.collect), so the timeline is the same.

Three threads: one gunzips (ISA-L and zlib let go of the interpreter while they inflate), one
scans (the scanner lets go of it while it scans a block), and the caller's sorts each block into
the collector's columns, in the file's order. An event whose fields have unusual types (a ``ts``
given as a string, ``args`` that is not an object) is decoded the slow way
(doctor.trace.typed_events), with those after it up to SLOW_EVENTS; a file that is not JSON, or
that ends early, raises :class:`NotScanned`, and the caller reads it again the slow way, which
says what is wrong.
"""

from __future__ import annotations

import json
import queue
import re
import threading
from pathlib import Path
from typing import IO, Any

import numpy as np

from doctor.trace.budget import EventBudget
from doctor.trace.collect import BlockCollector
from doctor.trace.heap import release_freed_memory
from doctor.trace.reader import _GUNZIP_ERRORS, TraceMeta, _gunzip
from doctor.trace.scan_codes import BlockCodes
from doctor.trace.typed_events import READER as TYPED_READER
from doctor.trace.typed_events import decode_array

try:
    from doctor.trace import _scan
except ImportError:  # built with the package where a C compiler is; else msgspec reads
    _scan = None  # type: ignore[assignment]

try:
    import msgspec
except ImportError:  # pragma: no cover - a dependency
    msgspec = None  # type: ignore[assignment]

#: Whether the C scanner is here (it also needs msgspec, which decodes the args it points at).
AVAILABLE = _scan is not None and msgspec is not None
#: Which reader reads traces: the C scanner (msgspec decoding the events it leaves to the slow
#: way), or msgspec alone (doctor.trace.typed_events.READER).
READER = f"scan (C), {TYPED_READER} where it cannot" if AVAILABLE else TYPED_READER
#: Events scanned into the columns at once.
BLOCK_EVENTS = 16384
#: Bytes inflated (or read) at a time.
CHUNK_BYTES = 4 << 20
#: Bytes of the next chunk put after the end of the last one, for the event the two share.
SEAM_BYTES = 64 << 10
#: Chunks inflated ahead of the scanner, and blocks scanned ahead of their sorting (each holds
#: the chunk its args lie in): 3 keeps the 2 M-event trace at 190-195 MB; 4 cost 1-3 MB more.
AHEAD = 3
#: Events of unusual types decoded the slow way together.
SLOW_EVENTS = 4096
_READ_ERRORS: tuple[type[Exception], ...] = (*_GUNZIP_ERRORS, ValueError)
#: What decoding the text of a name or of args raises where the scanner skipped over bytes that
#: are not JSON (it checks an event's structure, not every value nested in its args).
_DECODE_ERRORS: tuple[type[Exception], ...] = (
    json.JSONDecodeError, UnicodeDecodeError,
    *((msgspec.DecodeError,) if msgspec is not None else ()))
_SEPARATORS = re.compile(rb"[ \t\r\n,]*")
_WS = re.compile(rb"[ \t\r\n]*")


class NotScanned(Exception):
    """The trace cannot be scanned (not JSON, cut short): read it the slow way."""


def load_scanned(path: Path, col: BlockCollector, budget: EventBudget) -> TraceMeta:
    """Scan the trace at ``path`` into ``col`` (``budget`` applied after each block); its
    top-level facts. NotScanned when the slow way must read it. Gunzip (_Chunks) and the scan
    (_Walk) run in threads of their own; this one sorts the blocks into ``col``."""
    chunks = _Chunks(path)
    walk = _Walk(chunks)
    scanner = threading.Thread(target=walk.run, name="doctor-scan", daemon=True)
    scanner.start()
    codes = BlockCodes(col, walk.tables)
    try:
        while (item := walk.take()) is not None:
            if isinstance(item, _Block):
                codes.add(item)
            else:
                col.add(item)
            budget.apply(col)
    except _DECODE_ERRORS as err:  # a value the scanner only skipped over is not JSON
        raise NotScanned(f"not JSON: {err}") from err
    finally:
        walk.stop.set()
        chunks.close()
        scanner.join()
    release_freed_memory()  # the chunks' and blocks' memory, before the columns are joined
    return TraceMeta.from_top_level(str(path), walk.top)


class _Chunks:
    """The file's bytes (gunzipped when gzipped), read a chunk at a time by a thread beside
    this one."""

    def __init__(self, path: Path) -> None:
        try:
            with path.open("rb") as probe:
                gz = probe.read(2) == b"\x1f\x8b"
            self._fh: IO[bytes] = _gunzip(path) if gz else path.open("rb")
        except OSError as err:
            raise NotScanned(str(err)) from err
        self._queue: queue.Queue[bytes | BaseException | None] = queue.Queue(AHEAD)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="doctor-gunzip", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            while not self._stop.is_set():
                data = self._fh.read(CHUNK_BYTES)
                self._put(data or None)
                if not data:
                    return
        except _READ_ERRORS as err:
            self._put(err)

    def _put(self, item: bytes | BaseException | None) -> None:
        _put(self._queue, item, self._stop)

    def next(self) -> bytes | None:
        """The next chunk; None at the end of the file."""
        while True:
            try:
                item = self._queue.get(timeout=0.1)
                break
            except queue.Empty:
                if self._stop.is_set():
                    raise NotScanned("stopped") from None
        if isinstance(item, BaseException):
            raise NotScanned(f"cannot decompress: {item}")
        if item is None:
            self._queue.put(None)  # asked again, still the end
        return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._fh.close()


def _put(out: queue.Queue[Any], item: Any, stop: threading.Event) -> None:
    """Put ``item`` in ``out`` unless ``stop`` is set first."""
    while not stop.is_set():
        try:
            out.put(item, timeout=0.1)
            return
        except queue.Full:
            continue


class _Block:
    """One block of scanned events: the scanner's columns of its rows, and the bytes their
    args lie in."""

    __slots__ = ("buf", "cat", "corr", "dur", "hi", "lo", "name", "ph", "tid", "ts")

    def __init__(self) -> None:
        n = BLOCK_EVENTS
        self.ph = np.empty(n, np.uint8)
        self.name, self.cat, self.tid = (np.empty(n, np.int32) for _ in range(3))
        self.ts, self.dur = np.empty(n, np.float64), np.empty(n, np.float64)
        self.corr, self.lo, self.hi = (np.empty(n, np.int64) for _ in range(3))
        self.buf = b""

    def columns(self) -> tuple[np.ndarray, ...]:
        return (self.ph, self.name, self.cat, self.tid, self.ts, self.dur, self.corr, self.lo,
                self.hi)

    def cut(self, rows: int, buf: bytes) -> _Block:
        """This block with its first ``rows`` rows only, their args in ``buf``."""
        for name in self.__slots__:
            if name != "buf":
                setattr(self, name, getattr(self, name)[:rows])
        self.buf = buf
        return self


class _Walk:
    """The trace's structure: top-level keys around the event array, or a bare array."""

    def __init__(self, chunks: _Chunks) -> None:
        assert _scan is not None
        self.chunks = chunks
        self.buf = b""
        self.pos = 0
        self.top: dict[str, Any] = {}
        self.tables = (_scan.Interner(), _scan.Interner(), _scan.Interner())
        self.stop = threading.Event()
        # blocks of columns, events decoded the slow way, then None (or an exception)
        self._out: queue.Queue[_Block | list[Any] | BaseException | None] = queue.Queue(AHEAD)

    def take(self) -> _Block | list[Any] | None:
        """The next block scanned (or events decoded the slow way); None after the last."""
        item = self._out.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def fill(self) -> bool:
        """Read one more chunk onto what is left of the buffer; False at the end of the file."""
        data = self.chunks.next()
        if data is None:
            return False
        self.buf = self.buf[self.pos:] + data if self.pos < len(self.buf) else data
        self.pos = 0
        return True

    def peek(self, pattern: re.Pattern[bytes] = _WS) -> int:
        """The next byte after ``pattern`` (-1 at the end of the file)."""
        while True:
            m = pattern.match(self.buf, self.pos)
            self.pos = m.end() if m else self.pos
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.fill():
                return -1

    def value_end(self) -> int:
        """Where the JSON value at the cursor ends, reading on as needed."""
        assert _scan is not None
        while True:
            end = _scan.value_end(self.buf, self.pos)
            if end >= 0:
                return end
            if end == -2 or not self.fill():
                raise NotScanned("not JSON")

    def value(self) -> Any:
        end = self.value_end()
        try:
            value = json.loads(self.buf[self.pos:end])
        except ValueError as err:
            raise NotScanned("not JSON") from err
        self.pos = end
        return value

    def run(self) -> None:
        """In the scanning thread: the whole file, its blocks handed to take()."""
        try:
            self.walk()
        except BaseException as err:  # raised again in the reading thread
            _put(self._out, err, self.stop)
        else:
            _put(self._out, None, self.stop)

    def walk(self) -> None:
        first = self.peek()
        if first == ord("["):
            self.events()
        elif first == ord("{"):
            self.pos += 1
            while (nxt := self.peek(_SEPARATORS)) != ord("}"):
                if nxt != ord('"'):
                    raise NotScanned("not a trace")
                key = self.value()
                if self.peek() != ord(":"):
                    raise NotScanned("not a trace")
                self.pos += 1
                if key == "traceEvents" and self.peek() == ord("["):
                    self.events()
                else:
                    self.top[key] = self.value()
        else:
            raise NotScanned("not a trace")

    def events(self) -> None:
        """The event array from its opening bracket to its closing one. Where a chunk ends
        inside an event, the event is scanned from a seam (what is left of the buffer and the
        next chunk's first SEAM_BYTES), then the chunk itself: only the seam is copied, not the
        chunk (an event larger than the seam has the two joined)."""
        assert _scan is not None
        self.pos += 1
        chunk: bytes | None = None  # the chunk whose start the seam holds, from switch_at
        switch_at = 0
        block = _Block()
        while True:
            rows, self.pos, status = _scan.scan(self.buf, self.pos, *self.tables,
                                                *block.columns())
            if rows:
                _put(self._out, block.cut(rows, self.buf), self.stop)
                block = _Block()
            if self.stop.is_set():
                raise NotScanned("stopped")
            if chunk is not None:
                if self.pos >= switch_at:  # past the seam's start: on in the chunk itself
                    self.buf, self.pos, chunk = chunk, self.pos - switch_at, None
                    if status == _scan.NEED_MORE:
                        continue
                elif status != _scan.FULL:  # an event larger than the seam
                    self.buf, chunk = self.buf[:switch_at] + chunk, None
                    if status == _scan.NEED_MORE:
                        continue
            if status == _scan.END:
                return
            if status == _scan.NEED_MORE:
                data = self.chunks.next()
                if data is None:
                    raise NotScanned("the file ends inside the event array")
                switch_at = len(self.buf) - self.pos
                if switch_at:
                    self.buf, chunk = self.buf[self.pos:] + data[:SEAM_BYTES], data
                else:
                    self.buf = data
                self.pos = 0
            elif status == _scan.ODD:
                self.slow_events()
            elif status == _scan.ERROR:
                raise NotScanned("not JSON")

    def slow_events(self) -> None:
        """The events from the cursor (the first of unusual types), decoded the slow way."""
        texts: list[bytes] = []
        while len(texts) < SLOW_EVENTS and self.peek(_SEPARATORS) not in (ord("]"), -1):
            end = self.value_end()
            texts.append(self.buf[self.pos:end])
            self.pos = end
        body = b"[" + b",".join(texts) + b"]"
        events = decode_array(body.decode("utf-8", "replace"))
        if events is None:
            raise NotScanned("not JSON")
        _put(self._out, events, self.stop)
