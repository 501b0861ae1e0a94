"""Fixed-size ring buffers of small records in memory-mapped files.

The training thread writes a record with one ``struct.pack_into`` call and never allocates; the
file has a fixed size, so disk use is bounded whatever the run's length; and since the pages
belong to the file, what was written survives the process being killed, so the parent can still
analyse a crashed or killed job.

Layout: a 256-byte header (magic, version, capacity, struct format, field names), then
``capacity`` records, each led by its sequence number (1, 2, ...; 0 marks a slot never written),
so a reader finds the newest records without a shared counter.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

import numpy as np

from doctor.errors import RingFormatError, RingVersionError

__all__ = ["VERSION", "RingFormatError", "RingVersionError", "RingWriter", "read_ring"]

MAGIC = b"DRB1"
HEADER_SIZE = 256
_HEAD = struct.Struct("<4sIQQ32s192s")  # magic, version, capacity, (unused), format, names
VERSION = 2


class RingWriter:
    """Append-only writer; the oldest records are overwritten once ``capacity`` is reached."""

    def __init__(self, path: Path, fmt: str, names: tuple[str, ...], capacity: int) -> None:
        if not fmt.startswith("<"):
            raise ValueError(f"ring formats are little-endian ('<...'), not {fmt!r}")
        fmt = "<q" + fmt[1:]  # the sequence number leads every record
        names = ("seq", *names)
        self._record = struct.Struct(fmt)
        if len(names) != len(self._record.unpack(bytes(self._record.size))):
            raise ValueError(f"{len(names) - 1} names for format {fmt!r}")
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
        _HEAD.pack_into(self._map, 0, MAGIC, VERSION, capacity, 0, fmt.encode(),
                        ",".join(names).encode())
        self._pack = self._record.pack_into
        self._size = self._record.size

    def write(self, *values: int | float) -> None:
        seq = self._written + 1
        self._pack(self._map, HEADER_SIZE + (self._written % self.capacity) * self._size,
                   seq, *values)
        self._written = seq

    @property
    def written(self) -> int:
        return self._written

    def close(self) -> None:
        try:
            self._map.flush()
            self._map.close()
        except (ValueError, OSError):
            pass


def read_ring(path: Path) -> tuple[np.ndarray, int]:
    """Return (records oldest first as a structured array, total records ever written).

    Until a ring wraps, its records fill the slots in order from the first, so only the filled
    slots are read (found by bisection on the sequence numbers, in the mapped file): a ring of a
    short run costs what it holds, not its capacity."""
    with open(path, "rb") as f:
        head = f.read(HEADER_SIZE)
    if len(head) < HEADER_SIZE:
        raise RingFormatError(f"{path}: too short for a ring header")
    magic, version, capacity, _unused, fmt_raw, names_raw = _HEAD.unpack_from(head, 0)
    if magic != MAGIC:
        raise RingFormatError(f"{path}: not a doctor ring buffer")
    if version != VERSION:
        raise RingVersionError(f"{path}: ring version {version}, this doctor reads {VERSION}",
                               version)
    fmt = fmt_raw.rstrip(b"\0").decode()
    names = names_raw.rstrip(b"\0").decode().split(",")
    dtype = _dtype(fmt, names)
    if path.stat().st_size < HEADER_SIZE + capacity * dtype.itemsize:
        raise RingFormatError(f"{path}: truncated")
    body = np.memmap(path, dtype=dtype, mode="r", offset=HEADER_SIZE, shape=(capacity,))
    seq = body["seq"]
    if capacity and seq[capacity - 1] == 0:  # not wrapped: a filled prefix, in order
        lo, hi = 0, capacity - 1  # the first empty slot is in [lo, hi]
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
    if not fmt.startswith("<"):
        raise RingFormatError(f"unsupported ring format {fmt!r}")
    codes = fmt[1:]
    if len(codes) != len(names) or any(c not in _CODES for c in codes):
        raise RingFormatError(f"unsupported ring format {fmt!r} for {names}")
    return np.dtype([(n, "<" + _CODES[c]) for n, c in zip(names, codes, strict=True)])
