"""Read one large trace on several cores where the C scanner is not built (doctor.trace.scan,
which reads one on two cores by itself): this process cuts the event array into blocks of text
(doctor.trace.reader) and writes each into a slot of a ring of shared memory, worker processes
(forked after the ring was made) decode the slot in place and sort its events into columns
(doctor.trace.collect), and their columns are joined here in the blocks' order. Only a slot's
number crosses the pool's pipe one way, and a block's columns the other.

Each worker keeps one collector, so a name or thread is coded once per worker; with each block it
sends the columns of that block and the names and threads it has not sent before, and this
process recodes them into its own codes, in the blocks' order: the timeline is the one a single
process makes (the same threads in the same order of first sight). A cut that falls inside a
value (a string holding ``}, {`` at a block's edge) does not decode, nor may the block after it;
the trace is then read again one block after the other, which finds another cut (or says what
is wrong with a broken file).
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
import threading
from collections import deque
from multiprocessing.pool import AsyncResult
from pathlib import Path
from typing import Any

import numpy as np

from doctor.errors import TraceError
from doctor.trace.beside import fork_available
from doctor.trace.budget import EventBudget
from doctor.trace.collect import COLUMN_TYPES, KIND_COLUMNS, BlockCollector
from doctor.trace.events import Timeline, freeze, load_timeline, release_freed_memory
from doctor.trace.reader import TraceStream
from doctor.trace.typed_events import Event, decode_array, decode_block

#: Blocks handed out ahead of the one being joined, per worker.
AHEAD = 3
#: A block takes milliseconds; one not back after this long is lost (a worker killed: a pool
#: does not say so), and the trace is read again here, one block after the other.
BLOCK_TIMEOUT_S = 120.0
#: The bytes of one slot of the shared ring that hands blocks to the workers: a block of text
#: (BLOCK_CHARS, up to twice that where the buffer ran on) with its brackets; a larger one (text
#: far from ASCII) goes through the pool's pipe.
SLOT_BYTES = (2 << 20) + 4096

#: What a worker sends for one block: its key, the block's columns by kind, the names and
#: threads it codes for the first time (in code order), the steps, the first start and last end.
BlockColumns = tuple[Any, dict[str, list[Any]], list[str], list[str],
                     dict[int, tuple[float, float]], float, float]


class _Delta:
    """A collector that gives, block by block, what it added since the last block."""

    def __init__(self, key: Any) -> None:
        self.key = key
        self.col = BlockCollector()
        self._names = 0
        self._tids = 0

    def take(self, events: list[Event]) -> BlockColumns:
        col = self.col
        col.first, col.last, col.steps = float("inf"), float("-inf"), {}
        col.add(events)
        chunks, col.chunks = col.chunks, {kind: [] for kind in KIND_COLUMNS}
        names, tids = col.names[self._names:], col.tid_names[self._tids:]
        self._names, self._tids = len(col.names), len(col.tid_names)
        return self.key, chunks, names, tids, col.steps, col.first, col.last


_WORKER: _Delta | None = None
#: The ring of slots this process writes blocks into and its workers read them from: memory
#: shared across fork, so a block's text is copied once, not pickled through a pipe both ways.
_RING: mmap.mmap | None = None
#: One large trace read at a time in a process: the ring is a module global, for the workers
#: forked from it.
_ONE_AT_A_TIME = threading.Lock()


def _start_worker() -> None:
    global _WORKER
    _WORKER = _Delta(os.getpid())


def _collect(block: str | tuple[int, int]) -> BlockColumns | None:
    """In a worker: one block's columns; None when it does not decode (a bad cut). ``block`` is
    its text, or (slot, length) of its bytes (a JSON array) in the shared ring."""
    assert _WORKER is not None
    if isinstance(block, str):
        events = decode_block(block)
    else:
        assert _RING is not None
        slot, length = block
        with memoryview(_RING) as ring:
            events = decode_array(ring[slot * SLOT_BYTES:slot * SLOT_BYTES + length])
    return None if events is None else _WORKER.take(events)


class _Slots:
    """This process's side of the ring: a block's bytes put in the next slot, in turn. There are
    more slots than blocks in flight, so a slot is written again only once its block is
    joined."""

    def __init__(self, ring: mmap.mmap | None, count: int) -> None:
        self._ring, self._count, self._next = ring, count, 0

    def hand(self, text: str) -> str | tuple[int, int]:
        """What a worker is given for ``text``: its slot and length, or the text itself."""
        if self._ring is None:
            return text
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            return text
        if len(data) + 2 > SLOT_BYTES:
            return text
        slot = self._next
        self._next = (slot + 1) % self._count
        at = slot * SLOT_BYTES
        ring = self._ring
        ring[at:at + 1] = b"["
        ring[at + 1:at + 1 + len(data)] = data
        ring[at + 1 + len(data):at + 2 + len(data)] = b"]"
        return slot, len(data) + 2


class _CutInsideAValue(Exception):
    """A block that did not decode (or did not come back): read the trace again, serially."""


class _Join:
    """The workers' blocks joined, in order, into one collector's columns and codes."""

    def __init__(self) -> None:
        self.col = BlockCollector()
        self._codes: dict[Any, tuple[list[int], list[int]]] = {}

    def add(self, block: BlockColumns) -> None:
        key, chunks, names, tids, steps, first, last = block
        col = self.col
        name_codes, tid_codes = self._codes.setdefault(key, ([], []))
        name_codes.extend(col.name_code(n) for n in names)
        tid_codes.extend(col.tid_code(t) for t in tids)
        recode = {"name": np.array(name_codes, dtype=np.int64),
                  "tid": np.array(tid_codes, dtype=np.int64)}
        for kind, parts in chunks.items():
            columns = KIND_COLUMNS[kind]
            for start, end, values in parts:
                col.chunks[kind].append((start, end, [
                    recode[c][v].astype(COLUMN_TYPES[c]) if c in recode else v
                    for c, v in zip(columns, values, strict=True)]))
        for number, (s, e) in steps.items():
            if number not in col.steps or s < col.steps[number][0]:
                col.steps[number] = (s, e)
        col.first, col.last = min(col.first, first), max(col.last, last)


def load_timeline_parallel(path: str | Path, workers: int, max_events: int | None = None
                           ) -> Timeline:
    """The timeline of the trace at ``path`` (as doctor.trace.events.load_timeline gives it),
    its blocks decoded by ``workers`` processes (fork, where the system has it)."""
    with _ONE_AT_A_TIME:
        return _load(path, workers, max_events)


def _load(path: str | Path, workers: int, max_events: int | None) -> Timeline:
    global _RING
    fork = fork_available()
    context = multiprocessing.get_context("fork" if fork else "spawn")
    count = AHEAD * workers + 2  # more than are ever in flight
    # an anonymous mapping is shared with the children forked after it (not with spawned ones)
    _RING = mmap.mmap(-1, count * SLOT_BYTES) if fork else None
    try:
        with context.Pool(workers, initializer=_start_worker) as pool:
            timeline = _read(TraceStream(path), pool, workers, EventBudget(max_events),
                             _Slots(_RING, count))
    except (_CutInsideAValue, TraceError):
        # after a cut inside a value the next block starts inside it too, and may not parse:
        # one block after the other finds the right cuts, or says what is wrong with the file
        return load_timeline(path, max_events)
    finally:
        if _RING is not None:
            _RING.close()
        _RING = None
    release_freed_memory()
    return timeline


def _read(stream: TraceStream, pool: Any, workers: int, budget: EventBudget, slots: _Slots
          ) -> Timeline:
    join, here = _Join(), _Delta("here")
    pending: deque[AsyncResult[BlockColumns | None] | BlockColumns] = deque()
    for item in stream.texts():
        if isinstance(item, str):
            pending.append(pool.apply_async(_collect, (slots.hand(item),)))
        else:  # an event larger than a block, decoded here
            pending.append(here.take(item))
        while len(pending) > AHEAD * workers:
            _join_next(join, pending, budget)
    while pending:
        _join_next(join, pending, budget)
    return freeze(join.col, stream.meta, budget.finish(join.col))


def _join_next(join: _Join, pending: deque[Any], budget: EventBudget) -> None:
    item = pending.popleft()
    try:
        block = item.get(BLOCK_TIMEOUT_S) if isinstance(item, AsyncResult) else item
    except multiprocessing.TimeoutError:
        raise _CutInsideAValue from None
    if block is None:
        raise _CutInsideAValue
    join.add(block)
    budget.apply(join.col)
