"""Read one large trace on several cores: this process cuts the event array into blocks of text
(doctor.trace.reader), worker processes decode and sort them into columns
(doctor.trace.collect), and their columns are joined here in the blocks' order.

Each worker keeps one collector, so a name or thread is coded once per worker; with each block it
sends the columns of that block and the names and threads it has not sent before, and this
process recodes them into its own codes, in the blocks' order: the timeline is the one a single
process makes (the same threads in the same order of first sight). A cut that falls inside a
value (a string holding ``}, {`` at a block's edge) does not decode, nor may the block after it;
the trace is then read again one block after the other, which finds another cut (or says what
is wrong with a broken file).
"""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from multiprocessing.pool import AsyncResult
from pathlib import Path
from typing import Any

import numpy as np

from doctor.errors import TraceError
from doctor.trace.budget import EventBudget
from doctor.trace.collect import COLUMN_TYPES, KIND_COLUMNS, BlockCollector
from doctor.trace.events import Timeline, freeze, load_timeline, release_freed_memory
from doctor.trace.reader import TraceStream
from doctor.trace.typed_events import Event, decode_block

#: Blocks handed out ahead of the one being joined, per worker.
AHEAD = 3
#: A block takes milliseconds; one not back after this long is lost (a worker killed: a pool
#: does not say so), and the trace is read again here, one block after the other.
BLOCK_TIMEOUT_S = 120.0

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


def _start_worker() -> None:
    global _WORKER
    _WORKER = _Delta(os.getpid())


def _collect(text: str) -> BlockColumns | None:
    """In a worker: one block's columns; None when its text does not decode (a bad cut)."""
    assert _WORKER is not None
    events = decode_block(text)
    return None if events is None else _WORKER.take(events)


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
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods and os.name == "posix"
                                          else "spawn")
    try:
        with context.Pool(workers, initializer=_start_worker) as pool:
            timeline = _read(TraceStream(path), pool, workers, EventBudget(max_events))
    except (_CutInsideAValue, TraceError):
        # after a cut inside a value the next block starts inside it too, and may not parse:
        # one block after the other finds the right cuts, or says what is wrong with the file
        return load_timeline(path, max_events)
    release_freed_memory()
    return timeline


def _read(stream: TraceStream, pool: Any, workers: int, budget: EventBudget) -> Timeline:
    join, here = _Join(), _Delta("here")
    pending: deque[AsyncResult[BlockColumns | None] | BlockColumns] = deque()
    for item in stream.texts():
        if isinstance(item, str):
            pending.append(pool.apply_async(_collect, (item,)))
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
