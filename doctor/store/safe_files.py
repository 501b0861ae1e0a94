"""Writing and reading the files of a run directory so that neither can be turned against the user.

A run directory may be shared, received from someone else, or sit on a full disk:

- ``write_atomic`` never follows a link planted where it writes: the bytes go to a temporary file
  created beside the target with ``O_CREAT|O_EXCL|O_NOFOLLOW`` and are renamed over the target
  (a symlink there is replaced, never written through). A reader sees the old file or the new
  one, never half of one. Errors (ENOSPC, EIO, EROFS) are the caller's ``OSError``; the
  temporary file is removed.
- ``open_new`` is the same exclusive, no-follow creation, for a file written as a stream.
- ``read_bounded`` reads a regular file only (no FIFO, device or directory: a FIFO would block,
  ``/dev/zero`` never ends), never through a symlink, and at most ``limit`` bytes: a larger file
  is an error, not a MemoryError.

This module runs inside the job's processes too: it imports nothing beyond the standard library.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

__all__ = ["UnsafeFileError", "inside", "new_temporary", "open_new", "read_bounded",
           "write_atomic", "write_text_atomic"]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
DEFAULT_READ_LIMIT = 256 << 20


class UnsafeFileError(OSError):
    """A file that is not a regular file of its own (a link, a FIFO, a device), or too large."""


def new_temporary(path: Path) -> tuple[int, Path]:
    """A fresh file beside ``path`` (open for writing, and its name), created exclusively and
    never through a link."""
    for n in range(100):
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{n}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o644)
        except FileExistsError:
            continue
        return fd, tmp
    raise FileExistsError(f"no free temporary name beside {path}")


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a fresh temporary file renamed into place."""
    with open_new(path) as f:
        f.write(data)


def write_text_atomic(path: Path, text: str) -> None:
    write_atomic(path, text.encode("utf-8", "surrogateescape"))


@contextmanager
def open_new(path: Path) -> Iterator[IO[bytes]]:
    """A binary stream to a temporary file beside ``path``, renamed over it when the block ends
    without an error (and removed when it does not)."""
    fd, tmp = new_temporary(Path(path))
    with _into_place(tmp, path), os.fdopen(fd, "wb") as f:
        yield f


@contextmanager
def named_new(path: Path) -> Iterator[Path]:
    """The name of an empty temporary file beside ``path`` (created exclusively, never through
    a link), for a writer that opens files by name (torch.profiler's trace export): renamed
    over ``path`` when the block ends without an error, removed when it does not."""
    fd, tmp = new_temporary(Path(path))
    os.close(fd)
    with _into_place(tmp, path):
        yield tmp


@contextmanager
def _into_place(tmp: Path, path: Path) -> Iterator[None]:
    try:
        yield
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_bounded(path: Path, limit: int = DEFAULT_READ_LIMIT) -> bytes:
    """The bytes of ``path`` if it is a regular file (not through a link) of at most ``limit``
    bytes; otherwise ``UnsafeFileError`` (an ``OSError``), saying which."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | getattr(os, "O_NONBLOCK", 0))
    except OSError as err:
        if _NOFOLLOW and os.path.islink(path):
            raise UnsafeFileError(f"{path} is a symbolic link: not read") from err
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeFileError(f"{path} is not a regular file: not read")
        if info.st_size > limit:
            raise UnsafeFileError(f"{path} is {info.st_size} bytes, over the {limit} read")
        chunks = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise UnsafeFileError(f"{path} grew past the {limit} bytes read")
        return b"".join(chunks)
    finally:
        os.close(fd)


def inside(path: Path, root: Path) -> bool:
    """Whether ``path``, its links resolved, is ``root`` or below it."""
    try:
        return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(root))
    except OSError:
        return False
