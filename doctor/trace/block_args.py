"""The ``args`` of a block of events, read only for the events that need them: from typed
records (:class:`EventArgs`), or from the bytes the C scanner found them in
(doctor.trace.scan)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from doctor.trace.typed_events import Args, Event, number

try:
    from doctor.trace import _scan
except ImportError:  # built with the package where a C compiler is
    _scan = None  # type: ignore[assignment]

try:
    import msgspec
except ImportError:  # pragma: no cover - a dependency; the C scanner is not used without it
    msgspec = None  # type: ignore[assignment]

Int64s = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
_INT64 = 1 << 63  # a correlation outside int64 is none


class BlockArgs(Protocol):
    """The ``args`` of a block's events, read only for the events that need them."""

    def of(self, at: Int64s) -> list[Args | None]:
        """The ``args`` of the events at ``at`` (None: none)."""
        ...

    def correlations(self, at: Int64s) -> Int64s:
        """The correlation that ties each event at ``at`` to its launch; -1: none."""
        ...

    def numbers(self, at: Int64s, keys: tuple[str, ...]) -> Floats:
        """The args ``keys`` of the events at ``at`` as numbers (rows by keys; :func:`numbers`:
        nan where one is not)."""
        ...

    def text_ids(self, at: Int64s, keys: tuple[str, ...]) -> Int64s | None:
        """For each event at ``at``, an id that is equal where the args ``keys`` have equal
        values (to cache what is made of them); None where there are none cheaper than the
        values themselves."""
        ...


class EventArgs:
    """The ``args`` of a block of typed events."""

    __slots__ = ("_events",)

    def __init__(self, events: list[Event]) -> None:
        self._events = events

    def of(self, at: Int64s) -> list[Args | None]:
        events = self._events
        return [events[j].args for j in at.tolist()]

    def correlations(self, at: Int64s) -> Int64s:
        return _correlations(self.of(at))

    def numbers(self, at: Int64s, keys: tuple[str, ...]) -> Floats:
        return numbers_of(self.of(at), keys)

    def text_ids(self, at: Int64s, keys: tuple[str, ...]) -> Int64s | None:
        return None


def numbers_of(given: list[Args | None], keys: tuple[str, ...]) -> Floats:
    """The args ``keys`` of each of ``given`` as numbers (rows by keys), nan where none."""
    out = np.empty((len(given), len(keys)), np.float64)
    for k, key in enumerate(keys):
        out[:, k] = numbers([a.get(key) if a is not None else None for a in given])
    return out


def _correlations(args: Sequence[Any]) -> Int64s:
    """The correlation that ties each kernel, copy or runtime call to its launch; -1: none."""
    return np.fromiter((a.correlation if a is not None and type(a.correlation) is int
                        and -_INT64 <= a.correlation < _INT64 else -1
                        for a in args), np.int64, len(args))


def numbers(values: list[Any]) -> Floats:
    """The values as numbers (doctor.trace.typed_events.number), nan where one is not."""
    if set(map(type, values)) <= {int, float}:
        return np.array(values, dtype=np.float64)
    return np.array([number(v) for v in values], dtype=np.float64)


if msgspec is not None:
    _ARGS = msgspec.json.Decoder(list[Args | None])


class ScannedArgs:
    """The ``args`` of a scanned block, decoded from their bytes when asked for: the ones
    asked for at once joined into one JSON array, decoded in one call."""

    __slots__ = ("_buf", "_corr", "_hi", "_lo", "_tables")

    def __init__(self, buf: bytes, lo: Int64s, hi: Int64s, corr: Int64s,
                 tables: dict[tuple[str, ...], Any]) -> None:
        """``tables``: the interners of the args' texts (doctor.trace._scan.Interner) by the
        keys they read, shared by every block of a trace (its ids stay the same)."""
        self._buf, self._lo, self._hi, self._corr = buf, lo, hi, corr
        self._tables = tables

    def of(self, at: Int64s) -> list[Args | None]:
        if not len(at):
            return []
        buf = self._buf
        body = b"[" + b",".join([buf[lo:hi] if lo >= 0 else b"null" for lo, hi in zip(
            self._lo[at].tolist(), self._hi[at].tolist(), strict=True)]) + b"]"
        try:
            return _ARGS.decode(body)
        except msgspec.DecodeError:  # not UTF-8: as the slow way reads it
            return _ARGS.decode(body.decode("utf-8", "replace"))

    def correlations(self, at: Int64s) -> Int64s:
        return self._corr[at]

    def numbers(self, at: Int64s, keys: tuple[str, ...]) -> Floats:
        assert _scan is not None
        out = np.empty((len(at), len(keys)), np.float64)
        if _scan.args_numbers(self._buf, self._lo[at], self._hi[at], _as_bytes(keys), out):
            return out
        return numbers_of(self.of(at), keys)  # a number given as a string: read the slow way

    def text_ids(self, at: Int64s, keys: tuple[str, ...]) -> Int64s | None:
        assert _scan is not None
        table = self._tables.get(keys)
        if table is None:
            table = self._tables[keys] = _scan.Interner()
        ids = np.empty(len(at), np.int32)
        _scan.args_ids(self._buf, self._lo[at], self._hi[at], _as_bytes(keys), table, ids)
        return ids.astype(np.int64)


_KEY_BYTES: dict[tuple[str, ...], tuple[bytes, ...]] = {}


def _as_bytes(keys: tuple[str, ...]) -> tuple[bytes, ...]:
    found = _KEY_BYTES.get(keys)
    if found is None:
        found = _KEY_BYTES[keys] = tuple(json.dumps(k)[1:-1].encode() for k in keys)
    return found
