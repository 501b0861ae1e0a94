"""What the C scanner's ids of names, categories and threads mean in the collector's codes,
and a scanned block sorted into the collector's columns (doctor.trace.scan's sorting thread)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np

from doctor.trace.block_args import ScannedArgs
from doctor.trace.collect import BlockCollector, Int64s

if TYPE_CHECKING:
    from doctor.trace.scan import _Block as Block


class BlockCodes:
    """What the scanner's ids mean in the collector's codes; a scanned block sorted into the
    collector's columns."""

    def __init__(self, col: BlockCollector, tables: tuple[Any, Any, Any]) -> None:
        self.col = col
        self.tables = tables
        # the collector's code of each id (-1: not given yet)
        self._names = np.empty(0, np.int64)
        self._cats = np.empty(0, np.int64)
        self._tids = np.empty(0, np.int64)
        self._texts: dict[tuple[str, ...], Any] = {}  # the args' texts' ids (ScannedArgs)

    def add(self, block: Block) -> None:
        col = self.col
        # new names in order of first sight (the ids are given in that order), up to the
        # block's last: the scanner may have read on into the next blocks
        self._names = _extend(self._names, self.tables[0], block.name, col.name_code)
        self._cats = _extend(self._cats, self.tables[1], block.cat, col.category_code)
        tid_ids = block.tid.astype(np.int64)
        top = int(tid_ids.max()) + 1
        if len(self._tids) < top:
            grown = np.full(top, -1, np.int64)
            grown[:len(self._tids)] = self._tids
            self._tids = grown

        def tid_codes(at: Int64s) -> Int64s:
            ids = tid_ids[at]
            codes = self._tids[ids]
            new = codes < 0
            if new.any():  # given in the order the events that keep a thread first show it
                keys = self.tables[2].keys
                unseen, first = np.unique(ids[new], return_index=True)
                for k in unseen[np.argsort(first)].tolist():
                    self._tids[k] = col.tid_code(_text(keys[k]))
                codes = self._tids[ids]
            return codes

        col.add_columns(block.ph.astype(bool), self._names[block.name], block.ts, block.dur,
                        self._cats[block.cat], tid_codes,
                        ScannedArgs(block.buf, block.lo, block.hi, block.corr, self._texts))


def _extend(codes: Int64s, table: Any, ids: np.ndarray, code_of: Any) -> Int64s:
    """``codes`` given for every id up to the largest of ``ids``."""
    top = int(ids.max()) + 1
    if len(codes) >= top:
        return codes
    keys = table.keys
    new = [code_of(_text(k)) for k in keys[len(codes):top]]
    return np.concatenate([codes, np.array(new, np.int64)])


def _text(raw: bytes) -> str:
    """A string as the trace's bytes write it between its quotes (JSONDecodeError where it is
    not JSON: load_scanned then leaves the trace to the slow way)."""
    if b"\\" not in raw:
        return raw.decode("utf-8", "replace")
    try:
        text = json.loads(b'"' + raw + b'"')
    except UnicodeDecodeError:
        text = json.loads('"' + raw.decode("utf-8", "replace") + '"')
    assert isinstance(text, str)
    return text
