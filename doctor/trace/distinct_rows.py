"""Rows of integers computed once per distinct (name, args text) of the events of a trace: a
host op's cost and layout, a copy's kind and size, a collective's arguments. A job's ops repeat
every step, so a trace of millions of events has a few thousand distinct ones; where the block's
args are bytes the C scanner found (doctor.trace.block_args.ScannedArgs), an event like one seen
before has no args decoded at all."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from doctor.trace.block_args import BlockArgs, Int64s
from doctor.trace.kinds import copy_kind
from doctor.trace.op_costs import COST_DTYPES, COST_KINDS, OpCost, conv_layout, op_cost
from doctor.trace.typed_events import Args, count, number

_NO_ARGS = Args()


class Rows:
    """Rows of ``width`` integers computed once per key (an event's name code and the id of
    its args' text), found for many keys at once."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.rows = np.zeros((0, width), np.int64)
        self._keys = np.zeros(0, np.int64)  # sorted
        self._at = np.zeros(0, np.int64)  # the row of each key

    def table(self, rows: list[tuple[int, ...]]) -> npt.NDArray[np.int64]:
        """``rows`` as an array (no row: 0 by width)."""
        return np.array(rows, np.int64).reshape(len(rows), self.width)

    def find(self, keys: Int64s) -> Int64s:
        """The row of each of ``keys`` (-1: none yet)."""
        if not len(self._keys):
            return np.full(len(keys), -1, np.int64)
        at = np.minimum(np.searchsorted(self._keys, keys), len(self._keys) - 1)
        return np.where(self._keys[at] == keys, self._at[at], -1)

    def add(self, keys: Int64s, rows: list[tuple[int, ...]]) -> Int64s:
        """Keep ``rows`` for ``keys`` (new ones); their rows."""
        first = len(self.rows)
        self.rows = np.concatenate([self.rows, self.table(rows)])
        at = np.arange(first, len(self.rows))
        keys = np.concatenate([self._keys, keys])
        order = np.argsort(keys, kind="stable")
        self._keys, self._at = keys[order], np.concatenate([self._at, at])[order]
        return at


def rows_by_text(names: list[str], i: Int64s, codes: Int64s, args: BlockArgs,
                 keys: tuple[str, ...], seen: Rows,
                 compute: Callable[[str, Args | None], tuple[int, ...]]
                 ) -> npt.NDArray[np.int64]:
    """``compute(name, args)`` of the events at ``i`` (rows of ``seen.width`` integers),
    which reads only the args ``keys``: found in ``seen`` by the name and the text of those
    args where the block has it (no args decoded for an event like one seen before: a
    job's ops repeat every step), else computed for each."""
    ids = args.text_ids(i, keys)
    if ids is None:
        return seen.table([compute(names[codes[j]], a)
                           for j, a in zip(i.tolist(), args.of(i), strict=True)])
    pairs = (ids << 32) | codes[i]
    unique, first, inverse = np.unique(pairs, return_index=True, return_inverse=True)
    at = seen.find(unique)
    new = np.flatnonzero(at < 0)
    if len(new):
        found = args.of(i[first[new]])
        at[new] = seen.add(unique[new], [compute(names[codes[i[first[k]]]], a)
                                         for k, a in zip(new.tolist(), found, strict=True)])
    return seen.rows[at[inverse.reshape(-1)]]


def copy_row(name: str, a: Args | None) -> tuple[int, int, int]:
    """(kind, memory, bytes or -1) of a copy (doctor.trace.kinds.copy_kind)."""
    given = a or _NO_ARGS
    kind, mem = copy_kind(name, given)
    return kind, mem, count(number(given.get("bytes")))


def op_row(name: str, a: Args | None) -> tuple[int, int, int, int, int]:
    """(cost kind code, dtype code, flops, bytes, layout) of a host op whose name has a cost
    formula: -1 codes and zeros without its shapes (record_shapes=True records them)."""
    dims = a.input_dims if a is not None else None
    if a is None or dims is None:
        return -1, -1, 0, 0, 0
    found = op_cost(name, dims, a.get("Input type"))
    layout = 0
    if found is not None and "Input Strides" in a:
        layout = conv_layout(name, dims, a.get("Input Strides"))
    return (*cost_columns(found), layout)


def cost_columns(cost: OpCost | None) -> tuple[int, int, int, int]:
    """(kind code, dtype code, flops, bytes) of an op's cost; -1 codes and zeros for none."""
    flops, nbytes = (count(cost.flops), count(cost.bytes)) if cost is not None else (-1, -1)
    if cost is None or flops < 0 or nbytes < 0:  # (shapes too large to be real: no cost)
        return -1, -1, 0, 0
    return COST_KINDS.index(cost.kind), COST_DTYPES.index(cost.dtype), flops, nbytes
