"""The process's heap (glibc's malloc) while a large trace is read."""

from __future__ import annotations

import ctypes
import sys
from typing import Any

#: glibc's mallopt parameter for the size from which a block is mapped on its own.
M_MMAP_THRESHOLD = -3
#: The size set (glibc's initial one): a block this large or larger is its own mapping, handed
#: back to the system as soon as it is freed.
MMAP_THRESHOLD = 256 << 10


def steady_mmap_threshold() -> None:
    """Keep glibc's mmap threshold where it starts. glibc raises it to the size of each mapped
    block that is freed, so once the reader's first chunk of bytes (megabytes) is freed, every
    later chunk comes from the heap, and the heap, left in pieces by the blocks' small arrays
    between them, keeps tens of megabytes it no longer uses (2 M events: 204 MB at the peak,
    179 MB with the threshold kept). Setting it turns the raising off, for the process (the
    trace's reader runs in doctor's own). A no-op where the C library is not glibc."""
    global _MALLOPT
    if _MALLOPT is None:
        _MALLOPT = _libc_function("mallopt")
        if _MALLOPT:
            _MALLOPT(M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def _libc_function(name: str) -> Any:
    """glibc's function ``name``, or False elsewhere."""
    try:
        return getattr(ctypes.CDLL("libc.so.6"), name) if sys.platform == "linux" else False
    except (OSError, AttributeError):  # not glibc (musl, another libc)
        return False


def release_freed_memory() -> None:
    """Hand the memory freed by the blocks and their columns back to the system (glibc's
    ``malloc_trim``): glibc keeps freed heap memory for reuse, and the blocks' many small
    arrays leave it in pieces, so a 2-million-event trace kept 90 MB it no longer used. A no-op
    elsewhere."""
    global _TRIM
    if _TRIM is None:
        _TRIM = _libc_function("malloc_trim")
    if _TRIM:
        _TRIM(0)


_TRIM: Any = None
_MALLOPT: Any = None
