"""Types of the C scanner (doctor/trace/_scan.c)."""

from typing import Any

NEED_MORE: int
END: int
FULL: int
ODD: int
ERROR: int

class Interner:
    """Raw strings to ids, in order of first sight."""

    @property
    def keys(self) -> list[bytes]: ...

def scan(buf: Any, pos: int, names: Interner, cats: Interner, tids: Interner, ph: Any,
         name: Any, cat: Any, tid: Any, ts: Any, dur: Any, corr: Any, args_lo: Any,
         args_hi: Any) -> tuple[int, int, int]: ...
def value_end(buf: Any, pos: int) -> int: ...
def args_numbers(buf: Any, lo: Any, hi: Any, keys: tuple[bytes, ...], out: Any) -> bool: ...
def args_ids(buf: Any, lo: Any, hi: Any, keys: tuple[bytes, ...], interner: Interner,
             out: Any) -> None: ...
