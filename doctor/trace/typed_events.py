"""Trace events as typed records with only the fields the analysis reads, decoded at C speed.

A block of the ``traceEvents`` array (many events as one JSON text) is decoded by ``msgspec``
straight into :class:`Event` records: the fields the timeline reads, every other key skipped in C,
never a dict per event. A block whose values do not have the usual types (a ``ts`` given as a
string, ``args`` that is not an object) is decoded again by the standard library and each event
converted by :func:`from_dict`, which takes numbers from strings as the analysis always has; so
does every block where ``msgspec`` is not installed. :data:`READER` says which decoder runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

try:
    import msgspec
except ImportError:  # pragma: no cover - msgspec is a dependency; a missing wheel falls back
    msgspec = None  # type: ignore[assignment]

#: Which decoder reads the events: "msgspec" (C, typed) or "json" (the standard library).
READER = "msgspec" if msgspec is not None else "json"

#: The ``args`` keys the analysis reads, and the attribute each is kept in.
ARG_KEYS = {
    "correlation": "correlation", "bytes": "nbytes", "kind": "kind",
    "Input Dims": "input_dims", "Input type": "input_type", "Input Strides": "input_strides",
    "Collective name": "collective_name", "In msg nelems": "in_nelems",
    "Out msg nelems": "out_nelems", "dtype": "dtype", "Group size": "group_size",
    "Device Type": "device_type", "Device Id": "device_id",
    "Total Allocated": "total_allocated", "Total Reserved": "total_reserved",
}
_ATTR_OF = ARG_KEYS


class _ArgsLookup:
    """Read an event's ``args`` by their trace names, as a dict would (``get``, ``in``)."""

    __slots__ = ()

    def get(self, key: str, default: Any = None) -> Any:
        attr = _ATTR_OF.get(key)
        value = getattr(self, attr, None) if attr is not None else None
        return default if value is None else value

    def __contains__(self, key: str) -> bool:
        return self.get(key) is not None


if msgspec is not None:
    def _arg(key: str) -> Any:
        return msgspec.field(default=None, name=key)

    class Args(msgspec.Struct, _ArgsLookup, gc=False):
        """The ``args`` of an event that the analysis reads (None: absent)."""

        correlation: Any = _arg("correlation")
        nbytes: Any = _arg("bytes")
        kind: Any = _arg("kind")
        input_dims: Any = _arg("Input Dims")
        input_type: Any = _arg("Input type")
        input_strides: Any = _arg("Input Strides")
        collective_name: Any = _arg("Collective name")
        in_nelems: Any = _arg("In msg nelems")
        out_nelems: Any = _arg("Out msg nelems")
        dtype: Any = _arg("dtype")
        group_size: Any = _arg("Group size")
        device_type: Any = _arg("Device Type")
        device_id: Any = _arg("Device Id")
        total_allocated: Any = _arg("Total Allocated")
        total_reserved: Any = _arg("Total Reserved")

    class Event(msgspec.Struct, gc=False):
        """One trace event: the fields the analysis reads."""

        ph: str | None = None
        cat: str | None = None
        name: str | None = None
        ts: float | None = None
        dur: float | None = None
        tid: int | str | None = None
        args: Args | None = None

    _BLOCK = msgspec.json.Decoder(list[Event])
    _ERRORS: tuple[type[Exception], ...] = (msgspec.DecodeError,)
else:  # pragma: no cover
    class Args(_ArgsLookup):  # type: ignore[no-redef]
        __slots__ = tuple(ARG_KEYS.values())

        def __init__(self, **values: Any) -> None:
            for attr in self.__slots__:
                setattr(self, attr, values.get(attr))

    class Event:  # type: ignore[no-redef]
        __slots__ = ("args", "cat", "dur", "name", "ph", "tid", "ts")

        def __init__(self, ph: Any = None, cat: Any = None, name: Any = None, ts: Any = None,
                     dur: Any = None, tid: Any = None, args: Any = None) -> None:
            self.ph, self.cat, self.name, self.ts = ph, cat, name, ts
            self.dur, self.tid, self.args = dur, tid, args

    _ERRORS = ()


#: Counts (bytes, elements, operations) at or past this are not a real trace's: the timeline
#: keeps them in int64 columns.
COUNT_LIMIT = 1 << 62


def count(value: float | None) -> int:
    """``value`` as a count for the timeline's columns: -1 where it is none, negative, not
    finite or too large to be real (a trace written by another tool, or damaged)."""
    if value is None or not 0 <= value < COUNT_LIMIT:  # (nan is not in the range either)
        return -1
    return int(value)


def number(value: Any) -> float | None:
    """A JSON value as a number: ints, floats and numeric strings (never a bool); else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def from_dict(ev: dict[str, Any]) -> Event:
    """An event decoded by the standard library as the typed record: numbers taken from
    strings, a name or category that is not text dropped, ``args`` that is not an object
    dropped."""
    raw = ev.get("args")
    args = None
    if isinstance(raw, dict):
        args = Args(**{attr: raw[key] for key, attr in ARG_KEYS.items() if key in raw})
    name, cat, ph, tid = ev.get("name"), ev.get("cat"), ev.get("ph"), ev.get("tid")
    return Event(ph=ph if isinstance(ph, str) else None, cat=cat if isinstance(cat, str) else None,
                 name=name if isinstance(name, str) else None, ts=number(ev.get("ts")),
                 dur=number(ev.get("dur")),
                 tid=tid if isinstance(tid, int | str) and not isinstance(tid, bool) else
                 (None if tid is None else str(tid)), args=args)


def from_dicts(events: Iterable[Any]) -> list[Event]:
    return [from_dict(ev) for ev in events if isinstance(ev, dict)]


def decode_block(text: str) -> list[Event] | None:
    """The events of ``text``, a comma-separated run of JSON objects (a block of the event
    array without its brackets); None when it is not that (a split inside a value)."""
    return decode_array("[" + text + "]")


def decode_array(body: str | bytes | memoryview) -> list[Event] | None:
    """The events of ``body``, a JSON array of objects (text, or UTF-8 bytes: a block that
    another process wrote into shared memory); None when it is not one."""
    if msgspec is not None:
        try:
            return _BLOCK.decode(body)
        except msgspec.ValidationError:
            pass  # values of unusual types: the standard library's, converted one by one
        except _ERRORS:
            return None
    try:
        values = json.loads(body if not isinstance(body, memoryview) else bytes(body))
    except ValueError:
        return None
    return from_dicts(values) if isinstance(values, list) else None
