"""Fixed-size ring buffers of small records in memory-mapped files.

The training thread writes a record with two ``struct.pack_into`` calls (well under a
microsecond) and never allocates; the file has a fixed size, so disk use is bounded whatever
the run's length; and since the pages belong to the file, what was written survives the process
being killed, so the parent can still analyse a crashed or killed job.

Layout: a 256-byte header (magic, version, capacity, records written, struct format, field
names), then ``capacity`` records.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

import numpy as np

MAGIC = b"DRB1"
HEADER_SIZE = 256
_HEAD = struct.Struct("<4sIQQ32s192s")  # magic, version, capacity, written, format, names
_COUNT = struct.Struct("<Q")
_COUNT_OFFSET = 16


class RingWriter:
    """Append-only writer; the oldest records are overwritten once ``capacity`` is reached."""

    def __init__(self, path: Path, fmt: str, names: tuple[str, ...], capacity: int) -> None:
        self._record = struct.Struct(fmt)
        if len(names) != len(self._record.unpack(bytes(self._record.size))):
            raise ValueError(f"{len(names)} names for format {fmt!r}")
        self.path = path
        self.capacity = capacity
        self._written = 0
        size = HEADER_SIZE + capacity * self._record.size
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        _HEAD.pack_into(self._map, 0, MAGIC, 1, capacity, 0, fmt.encode(),
                        ",".join(names).encode())

    def write(self, *values: int | float) -> None:
        i = self._written % self.capacity
        self._record.pack_into(self._map, HEADER_SIZE + i * self._record.size, *values)
        self._written += 1
        _COUNT.pack_into(self._map, _COUNT_OFFSET, self._written)

    @property
    def written(self) -> int:
        return self._written

    def close(self) -> None:
        try:
            self._map.flush()
            self._map.close()
        except (ValueError, OSError):
            pass


class RingFormatError(ValueError):
    """A ring file that is not one of ours, or is truncated."""


def read_ring(path: Path) -> tuple[np.ndarray, int]:
    """Return (records oldest first as a structured array, total records ever written)."""
    data = path.read_bytes()
    if len(data) < HEADER_SIZE:
        raise RingFormatError(f"{path}: too short for a ring header")
    magic, _version, capacity, written, fmt_raw, names_raw = _HEAD.unpack_from(data, 0)
    if magic != MAGIC:
        raise RingFormatError(f"{path}: not a doctor ring buffer")
    fmt = fmt_raw.rstrip(b"\0").decode()
    names = names_raw.rstrip(b"\0").decode().split(",")
    dtype = _dtype(fmt, names)
    if len(data) < HEADER_SIZE + capacity * dtype.itemsize:
        raise RingFormatError(f"{path}: truncated")
    body = np.frombuffer(data, dtype=dtype, count=capacity, offset=HEADER_SIZE)
    n = min(written, capacity)
    if written <= capacity:
        records = body[:n].copy()
    else:
        start = written % capacity
        records = np.concatenate([body[start:], body[:start]])
    return records, int(written)


_CODES = {"q": "i8", "Q": "u8", "i": "i4", "I": "u4", "d": "f8", "f": "f4", "h": "i2", "b": "i1"}


def _dtype(fmt: str, names: list[str]) -> np.dtype:
    if not fmt.startswith("<"):
        raise RingFormatError(f"unsupported ring format {fmt!r}")
    codes = fmt[1:]
    if len(codes) != len(names) or any(c not in _CODES for c in codes):
        raise RingFormatError(f"unsupported ring format {fmt!r} for {names}")
    return np.dtype([(n, "<" + _CODES[c]) for n, c in zip(names, codes, strict=True)])
