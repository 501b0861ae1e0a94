"""Compute something in a forked process while this one goes on, and take its result later.

A large trace's analysis has parts that read the same timeline and do not depend on each other
(its steps, its op table): a child forked now sees the timeline without a copy, computes one
part while this process computes the other, and sends back what it found (a small table). Where
there is no fork, in a daemonic process (a pool's worker may not start processes), or when the
child fails or is killed, the part is computed here instead: the result is the same, only later.
"""

from __future__ import annotations

import multiprocessing
import os
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, Generic, TypeVar

T = TypeVar("T")

#: A child that has not answered after this long is given up on (and the part computed here).
TIMEOUT_S = 300.0


def fork_available() -> bool:
    """Whether this system starts children by fork (POSIX with the fork start method): they
    then see this process's memory (a timeline, a shared ring) without a copy."""
    return "fork" in multiprocessing.get_all_start_methods() and os.name == "posix"


def _can_fork() -> bool:
    return fork_available() and not multiprocessing.current_process().daemon


class Beside(Generic[T]):
    """``compute()`` started in a forked child (:meth:`result` waits for it)."""

    def __init__(self, compute: Callable[[], T], fork: bool = True) -> None:
        self._compute = compute
        self._process: Any = None
        self._conn: Connection | None = None
        if not fork or not _can_fork():
            return
        context = multiprocessing.get_context("fork")
        mine, theirs = context.Pipe(duplex=False)
        try:
            process = context.Process(target=_child, args=(compute, theirs), daemon=True)
            process.start()
        except OSError:  # no memory or processes left for a child: compute it here
            mine.close()
            theirs.close()
            return
        theirs.close()
        self._process, self._conn = process, mine

    @property
    def forked(self) -> bool:
        """Whether a child computes it."""
        return self._conn is not None

    def result(self) -> T:
        """What ``compute()`` gave: the child's answer, or (it failed) computed here."""
        conn, process = self._conn, self._process
        if conn is None:
            return self._compute()
        self._conn = self._process = None
        try:
            if conn.poll(TIMEOUT_S):
                ok, value = conn.recv()
                if ok:
                    return value
        except (EOFError, OSError):
            pass  # the child died before it answered
        finally:
            conn.close()
            process.join(1.0)
            if process.is_alive():
                process.kill()
                process.join()
        return self._compute()


def _child(compute: Callable[[], Any], conn: Connection) -> None:
    try:
        answer: tuple[bool, Any] = (True, compute())
    except BaseException:  # any failure: the parent computes it itself
        answer = (False, traceback.format_exc(limit=3))
    try:
        conn.send(answer)
    finally:
        conn.close()
