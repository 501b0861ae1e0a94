"""Ring buffers of small records in memory-mapped files, bounded in size and safe on a full disk.

The training thread writes a record with one ``struct.pack_into`` call and never allocates; a
ring holds at most ``capacity`` records, so disk use is bounded whatever the run's length; and
since the pages belong to the file, what was written survives the process being killed, so the
parent can still analyse a crashed or killed job.

The file grows as records are written, in chunks whose blocks are reserved (``posix_fallocate``)
before the mapping reaches them: one page at first, doubling up to ``MAX_CHUNK``, then ``capacity``
records at most. So a short-lived process (a DataLoader worker of one epoch) leaves a page per
ring, in blocks and in apparent size, and no page the job writes is ever without its block: a
disk that fills (a checkpoint beside the run) cannot raise SIGBUS in the job. When a reservation
fails (ENOSPC, EDQUOT, EIO, EFBIG under a file-size limit) the ring stops recording: later writes
are dropped, the records already written stay, the error's number goes into the header (its page
is already reserved) and ``on_stop`` is told once. The job never sees the error.

Layout: a 256-byte header (magic, version, capacity, the errno that stopped the ring or 0, struct
format, field names), then up to ``capacity`` records, each led by its sequence number (1, 2, ...;
0 marks a slot never written), so a reader finds the newest records without a shared counter.
Version 3: the file holds the reserved slots only (version 2 was always ``capacity`` slots long).
"""

from __future__ import annotations

import errno
import mmap
import os
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import RingFormatError, RingVersionError

if TYPE_CHECKING:
    import numpy as np

__all__ = ["VERSION", "RingFormatError", "RingVersionError", "RingWriter", "read_ring",
           "ring_stop_reason"]

MAGIC = b"DRB1"
HEADER_SIZE = 256
_HEAD = struct.Struct("<4sIQQ32s192s")  # magic, version, capacity, stop errno, format, names
_STOP = struct.Struct("<Q")
_STOP_OFFSET = 16  # the stop errno's place in the header
VERSION = 3
PAGE = mmap.PAGESIZE
MAX_CHUNK = 256 << 10  # the most one reservation adds (bytes): about 10,000 records
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_UNSUPPORTED = frozenset({errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL})

OnStop = Callable[[OSError], None]


class RingWriter:
    """Append-only writer; the oldest records are overwritten once ``capacity`` is reached.

    Never raises an ``OSError``: a ring that cannot be created or grown records nothing more,
    keeps its reason in ``stopped`` and tells ``on_stop`` once."""

    def __init__(self, path: Path, fmt: str, names: tuple[str, ...], capacity: int,
                 on_stop: OnStop | None = None) -> None:
        if not fmt.startswith("<"):
            raise ValueError(f"ring formats are little-endian ('<...'), not {fmt!r}")
        fmt = "<q" + fmt[1:]  # the sequence number leads every record
        names = ("seq", *names)
        self._record = struct.Struct(fmt)
        if len(names) != len(self._record.unpack(bytes(self._record.size))):
            raise ValueError(f"{len(names) - 1} names for format {fmt!r}")
        if capacity < 1:
            raise ValueError(f"a ring holds at least one record, not {capacity}")
        self.path: Path | None = path
        self.capacity = capacity
        self.stopped: OSError | None = None
        self._on_stop = on_stop
        self._written = 0
        self._pack = self._record.pack_into
        self._size = self._record.size
        self._full = HEADER_SIZE + capacity * self._size
        self._fd = -1
        self._length = 0  # bytes of the file, all of them reserved and mapped
        self._room = 0  # records the reserved slots hold (sys.maxsize once all are)
        self._map: Any = None  # the mapping of the whole file; None until made, or closed
        self._maps: list[mmap.mmap] = []  # earlier, shorter mappings (closed with the ring)
        try:
            self._fd = _create(path)
            mapped = self._grow(min(self._full, PAGE))
            _HEAD.pack_into(mapped, 0, MAGIC, VERSION, capacity, 0, fmt.encode(),
                            ",".join(names).encode())
        except OSError as err:
            if self._fd >= 0 and self._map is None:  # no header: leave no file to misread
                try:
                    os.unlink(path)
                except OSError:
                    pass
            self._stop(err)

    @classmethod
    def unavailable(cls, fmt: str, names: tuple[str, ...], err: OSError) -> RingWriter:
        """A ring that records nothing: its process folder could not be made (``err``)."""
        ring = cls.__new__(cls)
        ring.path, ring.capacity, ring.stopped, ring._on_stop = None, 0, err, None
        ring._written, ring._fd, ring._map, ring._maps = 0, -1, None, []
        ring.write = ring._drop  # type: ignore[method-assign]
        return ring

    def write(self, *values: int | float) -> None:
        written = self._written
        if written >= self._room and not self._reserve():
            return
        self._pack(self._map, HEADER_SIZE + written % self.capacity * self._size,
                   written + 1, *values)
        self._written = written + 1

    def _drop(self, *values: int | float) -> None:
        """``write`` once the ring has stopped or closed: the record is dropped."""

    @property
    def written(self) -> int:
        return self._written

    def _reserve(self) -> bool:
        """Reserve the next chunk of slots (once per chunk); False when the ring stopped."""
        if self.stopped is not None or self._map is None:
            return False
        try:
            self._grow(min(self._full, _page_up(self._length + min(self._length, MAX_CHUNK))))
        except (OSError, ValueError) as err:  # ValueError: mmap refused the new length
            self._stop(err if isinstance(err, OSError) else OSError(errno.EIO, str(err)))
            return False
        return True

    def _grow(self, length: int) -> mmap.mmap:
        """Reserve the file's blocks up to ``length`` bytes, then map them (the new mapping)."""
        _reserve_blocks(self._fd, self._length, length)
        mapped = mmap.mmap(self._fd, length)
        if self._map is not None:
            self._maps.append(self._map)  # another thread may be writing through it now
        self._map = mapped
        self._length = length
        if length >= self._full:
            self._room = sys.maxsize
            os.close(self._fd)
            self._fd = -1
        else:
            self._room = (length - HEADER_SIZE) // self._size
        return mapped

    def _stop(self, err: OSError) -> None:
        """Record no more: say why in the header (when it is mapped) and to ``on_stop``, once."""
        self.stopped = err
        self.write = self._drop  # type: ignore[method-assign]
        try:
            if self._map is not None:
                _STOP.pack_into(self._map, _STOP_OFFSET, err.errno or errno.EIO)
        except (ValueError, OSError):
            pass
        self._close_fd()
        if self._on_stop is not None:
            try:
                self._on_stop(err)
            except Exception:  # telling is a courtesy; the job must not see it fail
                pass

    def _close_fd(self) -> None:
        if self._fd >= 0:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = -1

    def close(self) -> None:
        self.write = self._drop  # type: ignore[method-assign]
        self._close_fd()
        for mapped in (*self._maps, *([self._map] if self._map is not None else [])):
            try:
                mapped.flush()
                mapped.close()
            except (ValueError, OSError, BufferError):
                pass
        self._maps, self._map = [], None


def _create(path: Path) -> int:
    """A new ring file, created exclusively and never through a link: what is already there
    (an earlier process's ring of the same pid, a planted symlink) is replaced, not followed."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
    try:
        return os.open(path, flags, 0o644)
    except FileExistsError:
        os.unlink(path)
        return os.open(path, flags, 0o644)


def _reserve_blocks(fd: int, start: int, end: int) -> None:
    """Give bytes [start, end) of the file their blocks, extending it to ``end``."""
    if end <= start:
        return
    fallocate = getattr(os, "posix_fallocate", None)
    if fallocate is not None:
        try:
            fallocate(fd, start, end - start)
            return
        except OSError as err:  # a filesystem without it (where libc does not write zeros)
            if err.errno not in _UNSUPPORTED:
                raise
    zeros = bytes(min(end - start, MAX_CHUNK))  # no posix_fallocate: write the zeros
    at = start
    while at < end:
        at += os.pwrite(fd, zeros[:end - at], at)


def _page_up(n: int) -> int:
    return -(-n // PAGE) * PAGE


def ring_stop_reason(path: Path) -> str | None:
    """Why the ring at ``path`` stopped recording ("no space left on device"), or None when it
    did not (or its header cannot be read: read_ring says what is wrong with it)."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER_SIZE)
    except OSError:
        return None
    if len(head) < HEADER_SIZE or head[:4] != MAGIC:
        return None
    code = _STOP.unpack_from(head, _STOP_OFFSET)[0]
    if not code:
        return None
    text = os.strerror(code) if code < 1 << 16 else f"error {code}"
    return text[:1].lower() + text[1:]


def read_ring(path: Path) -> tuple[np.ndarray, int]:
    """Return (records oldest first as a structured array, total records ever written).

    The file holds the slots reserved so far (fewer than ``capacity`` until the ring is full
    size; a ring that stopped recording keeps what it had). Until a ring wraps, its records fill
    the slots in order from the first, so only the filled slots are read (found by bisection on
    the sequence numbers, in the mapped file): a ring of a short run costs what it holds, not
    its capacity."""
    import numpy as np

    with open(path, "rb") as f:
        head = f.read(HEADER_SIZE)
        size = os.fstat(f.fileno()).st_size
    if len(head) < HEADER_SIZE:
        raise RingFormatError(f"{path}: too short for a ring header")
    magic, version, capacity, _stop, fmt_raw, names_raw = _HEAD.unpack_from(head, 0)
    if magic != MAGIC:
        raise RingFormatError(f"{path}: not a doctor ring buffer")
    if version != VERSION:
        raise RingVersionError(f"{path}: ring version {version}, this doctor reads {VERSION}",
                               version)
    try:
        fmt = fmt_raw.rstrip(b"\0").decode()
        names = names_raw.rstrip(b"\0").decode().split(",")
    except UnicodeDecodeError as err:
        raise RingFormatError(f"{path}: a damaged ring header") from err
    dtype = _dtype(fmt, names)
    slots = min(capacity, (size - HEADER_SIZE) // dtype.itemsize)
    if slots <= 0:
        empty = np.zeros(0, dtype=dtype)
        return empty[[n for n in names if n != "seq"]].copy(), 0
    body = np.memmap(path, dtype=dtype, mode="r", offset=HEADER_SIZE, shape=(slots,))
    seq = body["seq"]
    if seq[slots - 1] == 0:  # not wrapped: a filled prefix, in order
        lo, hi = 0, slots - 1  # the first empty slot is in [lo, hi]
        while lo < hi:
            mid = (lo + hi) // 2
            if seq[mid] > 0:
                lo = mid + 1
            else:
                hi = mid
        records = np.array(body[:lo])
    else:
        used = np.array(body[seq > 0])
        records = used[np.argsort(used["seq"], kind="stable")]
    del body, seq
    written = int(records["seq"][-1]) if len(records) else 0
    return records[[n for n in names if n != "seq"]].copy(), written


_CODES = {"q": "i8", "Q": "u8", "i": "i4", "I": "u4", "d": "f8", "f": "f4", "h": "i2", "b": "i1"}


def _dtype(fmt: str, names: list[str]) -> np.dtype:
    import numpy as np

    if not fmt.startswith("<"):
        raise RingFormatError(f"unsupported ring format {fmt!r}")
    codes = fmt[1:]
    if len(codes) != len(names) or any(c not in _CODES for c in codes):
        raise RingFormatError(f"unsupported ring format {fmt!r} for {names}")
    return np.dtype([(n, "<" + _CODES[c]) for n, c in zip(names, codes, strict=True)])
