"""Reading back the files of a run directory that may be damaged, oddly typed or planted.

A run directory may come from someone else, or from a job killed as it wrote. Every file of it
is read here, through ``doctor.store.safe_files.read_bounded``: a regular file only (never a
FIFO, which would block, nor a device such as ``/dev/zero``, which never ends), never through a
symbolic link, and at most a cap of bytes. What cannot be read, or does not parse, is an
``Unreadable`` with one line that says why: the reader leaves the file out with a note (the
report is then partial), or refuses the run directory with that line.

The ``as_*`` helpers take a value of a JSON record as what it should be, or a default: a field
of the wrong type is as good as absent.
"""

from __future__ import annotations

import io
import json
import math
import os
import stat
from pathlib import Path
from typing import Any

from ..errors import RunDirError
from .safe_files import read_bounded

#: Caps on what is read of one file (bytes): JSON records, and the larger samples, stacks and
#: allocator snapshots; the arrays of an ``.npz`` once decompressed.
RECORD_LIMIT = 64 << 20
DATA_LIMIT = 256 << 20
ARRAYS_LIMIT = 1 << 30
INT64 = 1 << 63


class Unreadable(RunDirError):
    """A file of a run directory that is not read: not a regular file of its own, too large,
    or not what it should hold. Its message is one line."""


def _why(err: Exception) -> str:
    if isinstance(err, OSError) and err.strerror and not str(err).startswith(str(err.filename)):
        return err.strerror
    return str(err).splitlines()[0] if str(err) else type(err).__name__


def read_bytes(path: Path, limit: int = DATA_LIMIT) -> bytes:
    """The bytes of ``path``, a regular file of the run directory (Unreadable otherwise)."""
    try:
        return read_bounded(path, limit)
    except OSError as err:
        raise Unreadable(f"{path}: {_why(err)}") from err


def read_text(path: Path, limit: int = DATA_LIMIT) -> str:
    """The text of ``path``; bytes that are not UTF-8 read as U+FFFD."""
    return read_bytes(path, limit).decode("utf-8", "replace")


def read_json(path: Path, limit: int = RECORD_LIMIT) -> Any:
    """The JSON document in ``path`` (Unreadable when it is not JSON)."""
    data = read_bytes(path, limit)
    try:
        return json.loads(data.decode("utf-8", "replace"))
    except (ValueError, RecursionError) as err:
        raise Unreadable(f"{path}: not JSON ({_why(err)})") from err


def read_json_dict(path: Path, limit: int = RECORD_LIMIT) -> dict[str, Any]:
    """The JSON object in ``path`` (Unreadable when it is another JSON value)."""
    doc = read_json(path, limit)
    if not isinstance(doc, dict):
        raise Unreadable(f"{path}: a JSON {type(doc).__name__}, not an object")
    return doc


def load_arrays(path: Path, limit: int = DATA_LIMIT) -> dict[str, Any]:
    """The arrays of an ``.npz`` (name -> 1-D numeric ndarray), read whole and checked: a zip
    that is cut short or corrupt, an array of text or objects (never unpickled), or arrays past
    ``ARRAYS_LIMIT`` once decompressed are Unreadable."""
    import zipfile

    import numpy as np

    data = read_bytes(path, limit)
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            if sum(i.file_size for i in z.infolist()) > ARRAYS_LIMIT:
                raise Unreadable(f"{path}: its arrays are over {ARRAYS_LIMIT} bytes")
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = {name: z[name] for name in z.files}
    except Unreadable:
        raise
    except Exception as err:  # zipfile, numpy's format and EOF errors: a damaged file
        raise Unreadable(f"{path}: not readable as arrays ({_why(err)})") from err
    for name, array in arrays.items():
        if array.ndim != 1 or not np.issubdtype(array.dtype, np.number):
            raise Unreadable(f"{path}: {name} is not a column of numbers")
    return arrays


def regular_file(path: Path) -> bool:
    """Whether ``path`` is a regular file of its own (not a link, a FIFO, a device)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def real_dir_inside(path: Path, root: Path) -> bool:
    """Whether ``path`` is a directory, not a link, whose real path is under ``root``'s."""
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return False
        return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(root))
    except OSError:
        return False


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def as_bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def as_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def as_int(value: Any) -> int | None:
    """An int in int64's range (a whole float too), never a bool; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and -INT64 <= value < INT64 else None


def as_float(value: Any) -> float | None:
    """A finite number as a float, never a bool; None for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def printable(text: str) -> str:
    """``text`` with what cannot be written as UTF-8 (a lone surrogate: bytes of a name or an
    argument that were not UTF-8) as U+FFFD."""
    return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in text) if any(
        "\ud800" <= c <= "\udfff" for c in text) else text
